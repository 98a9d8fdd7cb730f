"""Devices: who owns which fields, selected by name or glob, laid out as one catalog.

A device is a table-model device (table + tag values, ``meters.s0``) or a tree-model device
(``root.sg.d1``); its fields share its timeline (or are aligned on time by the reading core).
:func:`select_devices` picks devices and fields from the metadata alone and lays out the
catalog of their series, device by device, field by field: the tables of the window views
(and of any view or engine that reads per device: a Ray read task) are contiguous runs of it.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tsfile_torch.catalog.build import (
    Catalog,
    SourceMetadata,
    device_name,
    lay_out,
    subset_catalog,
)
from tsfile_torch.errors import SchemaError

__all__ = ["DeviceSelection", "match_devices", "select_devices", "tag_codes"]


@dataclass(frozen=True)
class DeviceSelection:
    """Selected devices and fields: ``catalog`` holds ``fields`` of each device, in order."""

    catalog: Catalog
    #: device names, in catalog order
    names: list[str]
    #: (table, tag values...) of each device (tree model: the path's parts)
    keys: list[tuple]
    #: field names every device has, ``columns`` then the other ``targets``
    fields: list[str]
    columns: list[str]
    targets: list[str]

    def table_columns(self, k: int) -> tuple[int, ...]:
        """Catalog columns of device ``k``'s fields."""
        width = len(self.fields)
        return tuple(range(k * width, (k + 1) * width))


def match_devices(all_devices: list[str], patterns: Sequence[str] | None) -> list[str]:
    """Return the devices named by ``patterns`` (names or globs), in device order of matches.

    Raises:
        SchemaError: a pattern matches no device.
    """
    if patterns is None:
        return all_devices
    chosen: dict[str, None] = {}
    for item in patterns:
        matches = [d for d in all_devices if d == item or fnmatch.fnmatchcase(d, item)]
        if not matches:
            shown = ", ".join(all_devices[:8]) + (" ..." if len(all_devices) > 8 else "")
            raise SchemaError(f"devices: {item!r} matches no device; devices are {shown}")
        chosen.update(dict.fromkeys(matches))
    return list(chosen)


def select_devices(
    meta: SourceMetadata,
    columns: Sequence[str] | None,
    targets: Sequence[str] | None,
    patterns: Sequence[str] | None,
    start_time: int | None = None,
    end_time: int | None = None,
) -> DeviceSelection:
    """Select devices and their fields from metadata, and lay out their catalog.

    ``columns`` None: every numeric field all selected devices share; ``targets`` None:
    ``columns``; ``patterns`` None: every device that has every field asked for. A device
    with a field empty inside ``start_time`` / ``end_time`` is left out (it has no rows).

    Raises:
        SchemaError: unknown devices or fields, or a named device without a field asked for.
    """
    fields_of: dict[str, dict[str, str]] = {}  # device -> field -> column name
    key_of: dict[str, tuple] = {}  # device name -> (table, tag values...)
    for col in meta.numeric:
        shard = col.shards[0]
        fields_of.setdefault(device_name(shard.device), {})[shard.measurement] = col.name
        key_of[device_name(shard.device)] = tuple(shard.device)
    names = match_devices(list(fields_of), patterns)
    if columns is None:
        shared = [f for f in fields_of[names[0]] if all(f in fields_of[d] for d in names)]
        if not shared:
            raise SchemaError(
                f"devices {names[:5]} share no numeric field; pass columns=[...] and devices="
            )
        columns = tuple(shared)
    columns = list(columns)
    targets = list(targets) if targets is not None else list(columns)
    fields = list(dict.fromkeys(columns + targets))
    known = set().union(*(set(fields_of[d]) for d in names))
    unknown = [f for f in fields if f not in known]
    if unknown:
        raise SchemaError(
            f"fields {unknown} are not numeric fields of the selected devices; their "
            f"fields are {sorted(known)}"
        )
    if patterns is None:  # every device that has the fields asked for
        names = [d for d in names if all(f in fields_of[d] for f in fields)]
        if not names:
            raise SchemaError(
                f"no device has all of the fields {fields}; pick fields one device "
                f"has, or name devices= to see which field each one lacks"
            )
    missing = [(d, f) for d in names for f in fields if f not in fields_of[d]]
    if missing:
        d, f = missing[0]
        raise SchemaError(
            f"device {d!r} has no numeric field {f!r}; select devices that have every "
            f"field in columns / targets"
        )
    catalog = lay_out(
        meta,
        [fields_of[d][f] for d in names for f in fields],
        start_time,
        end_time,
        shared_timeline=False,
        drop_empty=True,
    )
    kept = set(catalog.column_names)  # a device with a field empty in range has no windows
    names = [d for d in names if all(fields_of[d][f] in kept for f in fields)]
    if len(names) * len(fields) != len(kept):
        catalog = subset_catalog(catalog, [fields_of[d][f] for d in names for f in fields])
    return DeviceSelection(catalog, names, [key_of[d] for d in names], fields, columns, targets)


def tag_codes(keys: Sequence[tuple]) -> tuple[list[list[str]], np.ndarray]:
    """Code each device's tag values (table model: the values after the table name).

    Returns the values of each tag level (schema order, sorted) and, per device, the index of
    its value in each level: int64 ``(devices, levels)``.
    """
    levels = max(len(d) - 1 for d in keys)
    tags = [[str(v) if v is not None else "" for v in d[1:]] for d in keys]
    tags = [t + [""] * (levels - len(t)) for t in tags]
    vocab = [sorted({t[j] for t in tags}) for j in range(levels)]
    codes = np.array(
        [[vocab[j].index(t[j]) for j in range(levels)] for t in tags], dtype=np.int64
    ).reshape(len(keys), levels)
    return vocab, codes

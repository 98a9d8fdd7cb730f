"""Which files a dataset reads: the build-time checks, and ``on_damaged``.

Note: damaged files at build. Before a dataset reads a file's metadata each file is checked,
cheapest first: against the manifest that lists it (:mod:`tsfile_torch.integrity.manifest`),
with ``on_damaged="skip"`` against what earlier reads found (a file a read found damaged is
remembered by identity: Note: remembered verdicts in :mod:`tsfile_torch.sources.content`), then
in the validation child (``validate=True``, :mod:`tsfile_torch.integrity.validate`), unless that
check already passed for the file as it is now (a file that passed is remembered by identity,
with the mode it passed and the tsfile and tsfile-torch versions that checked it: Note:
remembered verdicts; ``"full"`` covers ``"headers"``: a later
build of an unchanged file starts no child); the dataset then reads the metadata of the rest in
its own process. With ``on_damaged="raise"`` (the
default) the first check that finds damaged files raises one TsFileFormatError naming each of
them; with ``"skip"`` they are left out, one warning lists them, and ``ds.skipped`` says which
and why. Damage found later, while reading, always raises, naming the file.
"""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tsfile_torch import __version__
from tsfile_torch.errors import SKIP_HINT, FileProblem, TsFileFormatError, warn_caller
from tsfile_torch.integrity.manifest import check_manifests
from tsfile_torch.integrity.validate import damaged_error, validate_sources
from tsfile_torch.sources import Source
from tsfile_torch.sources.content import recall, remember, warn_unlisted

__all__ = ["Screened", "leave_out", "screen_sources"]


@dataclass
class Screened:
    """What :func:`screen_sources` found.

    Attributes:
        sources: the sources to read, in the given order.
        problems: the files left out and why (``on_damaged="skip"``).
        identities: source key -> identity carrying a content hash verified against a manifest.
    """

    sources: list[Source]
    problems: list[FileProblem]
    identities: dict[str, Any]


def screen_sources(sources: Sequence[Source], validate: bool | str, on_damaged: str) -> Screened:
    """Check ``sources`` as Note: damaged files at build says.

    Raises:
        TsFileFormatError: with ``on_damaged="raise"``, naming every damaged file one check
            found; a manifest cannot be read.
    """
    skip = on_damaged == "skip"
    manifests = check_manifests(sources)
    warn_unlisted(manifests.unlisted, "of their directory")
    problems = list(manifests.problems)
    if problems and not skip:
        raise damaged_error(problems)
    if skip:
        problems += _remembered([s for s in sources if s.name not in {p.name for p in problems}])
    good = [s for s in sources if s.name not in {p.name for p in problems}]
    if validate and good:
        mode = "full" if validate == "full" else "headers"
        keys = {s.name: _key(s) for s in good}
        todo = [s for s in good if not _passed(keys[s.name], mode)]
        found = validate_sources(todo, mode) if todo else []
        bad = {p.name for p in found}
        for source in todo:  # as the file is now: a write during the check moves its key
            if source.name not in bad and _key(source) == keys[source.name]:
                remember(keys[source.name], validated=mode, checker=checker())
        if found and not skip:
            raise damaged_error(found)
        problems += found
        good = [s for s in good if s.name not in bad]
    return Screened(good, problems, manifests.identities)


def _key(source: Source) -> str | None:
    """The identity a verdict about ``source`` is remembered under (``None``: not on disk)."""
    try:
        return source.index_key()
    except OSError:
        return None  # gone: the validation child says so


def _passed(key: str | None, mode: str) -> bool:
    """Whether the file at identity ``key`` passed a ``mode`` check before (``full`` covers
    ``headers``)."""
    record = recall(key)
    passed = record.get("validated")
    return record.get("checker") == checker() and (passed == "full" or passed == mode)


@functools.cache
def checker() -> str:
    """What a remembered pass was checked with: a verdict of another tsfile or tsfile-torch
    version (its reader may crash on what this one's passed, or the reverse) is checked anew."""
    try:
        native = importlib.metadata.version("tsfile")
    except importlib.metadata.PackageNotFoundError:
        native = "unknown"
    return f"tsfile {native}, tsfile-torch {__version__}"


def _remembered(sources: Sequence[Source]) -> list[FileProblem]:
    """Return the sources an earlier read found damaged, as they are now."""
    out = []
    for source in sources:
        try:
            key = source.index_key()
        except OSError:
            continue  # gone: reading its metadata says so
        damaged = recall(key).get("damaged")
        if damaged:
            text = damaged.removeprefix(f"{source.name}: ").removesuffix(f"; {SKIP_HINT}")
            out.append(FileProblem(source.name, f"an earlier read found it damaged: {text}"))
    return out


def leave_out(problems: Sequence[FileProblem], total: int) -> list[tuple[str, str]]:
    """Warn once about the files ``problems`` leaves out; return them as (name, reason).

    Raises:
        TsFileFormatError: every one of the ``total`` files is damaged.
    """
    if not problems:
        return []
    if len(problems) >= total:
        raise TsFileFormatError(
            f"every file is damaged, nothing left to read (on_damaged='skip'): "
            f"{damaged_error(problems)}"
        )
    listed = "; ".join(f"{p.name}: {p.reason}" for p in problems)
    warn_caller(f"on_damaged='skip': left out {len(problems)} of {total} files: {listed}")
    return [(p.name, p.reason) for p in problems]

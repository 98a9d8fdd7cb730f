"""Manifests: content hashes of TsFiles, written once, checked before a dataset first reads them.

TsFile pages carry no checksum, and damage inside a value page often decodes to plausible
values that no metadata statistic can tell from the real ones. A manifest can:
``tsfile-torch manifest DIR`` writes ``DIR/tsfile-torch-manifest.json`` listing every TsFile
under ``DIR`` (relative path with ``/``, size, content hash; the algorithm is named in the file).

A dataset over a local file that the nearest manifest in its directory or above it lists checks
the file against it before the first read (:func:`check_manifests`): size, then the content
hash. A mismatch is a :class:`~tsfile_torch.errors.TsFileFormatError` saying the content
differs from the manifest (``on_damaged="skip"`` leaves the file out instead). Hashing costs a
read of the whole file once per file identity: the hash is remembered by identity (Note:
remembered verdicts in :mod:`tsfile_torch.sources.content`), so later builds, DataLoader
workers and later runs do not hash again, and a file rewritten since gets a new identity and is
hashed again. A verified file's identity carries its hash, which settles a later ctime-only
change exactly (Note: content-relevant identity).

A file that the nearest manifest does not list (added after the manifest was written) is not
checked; a dataset warns about it. URL sources are checked against a manifest beside them
(same prefix) after each download, before the local copy is kept (Note: remote sources in
:mod:`tsfile_torch.sources.remote`); file objects are not checked against manifests.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from tsfile_torch.errors import FileProblem, TsFileFormatError
from tsfile_torch.pids import usable_cpus
from tsfile_torch.sources import LocalFile, Source
from tsfile_torch.sources.content import (
    ALGORITHM,
    MANIFEST_FORMAT,
    MANIFEST_NAME,
    MANIFEST_VERSION,
    FileIdentity,
    ManifestEntry,
    atomic_write,
    file_hash,
    parse_manifest,
)

__all__ = [
    "MANIFEST_NAME",
    "ManifestCheck",
    "check_manifests",
    "write_manifest",
]

#: files hashed at once (hashlib releases the GIL while hashing)
_HASH_THREADS = min(4, usable_cpus())


def _tsfiles(directory: str) -> list[str]:
    """Return every ``*.tsfile`` under ``directory`` (recursively), sorted."""
    found = []
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        found += [os.path.join(root, f) for f in sorted(files) if f.endswith(".tsfile")]
    return found


def _hash_one(path: str, force: bool) -> tuple[FileIdentity, str]:
    source = LocalFile(path)
    identity = FileIdentity.of(path)
    return identity, file_hash(path, path, identity.fields, source.index_key(identity), force)


def write_manifest(directory: str | os.PathLike) -> tuple[str, int, int]:
    """Write ``directory/tsfile-torch-manifest.json`` for every TsFile under ``directory``.

    Every file is hashed afresh; the hashes are also remembered by file identity, so a dataset
    built next does not hash them again.

    Returns:
        ``(manifest path, number of files, bytes hashed)``.

    Raises:
        TsFileFormatError: ``directory`` holds no TsFile, or a file changed while hashed.
        OSError: the manifest cannot be written.
    """
    directory = os.path.abspath(os.fspath(directory))
    paths = _tsfiles(directory)
    if not paths:
        raise TsFileFormatError(
            f"{directory}: no *.tsfile files under it; point at a directory of TsFiles"
        )
    with ThreadPoolExecutor(_HASH_THREADS) as pool:
        hashed = list(pool.map(lambda p: _hash_one(p, force=True), paths))
    files = [
        {
            "path": os.path.relpath(p, directory).replace(os.sep, "/"),
            "size": identity.size,
            "hash": digest,
        }
        for p, (identity, digest) in zip(paths, hashed, strict=True)
    ]
    record = {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "algorithm": ALGORITHM,
        "files": files,
    }
    path = os.path.join(directory, MANIFEST_NAME)
    text = json.dumps(record, indent=1) + "\n"
    atomic_write(path, lambda fh: fh.write(text.encode()), cache=False)
    return path, len(files), sum(f["size"] for f in files)


def _load(path: str) -> dict[str, ManifestEntry]:
    """Return relative path -> entry of the manifest at ``path``."""
    try:
        with open(path, "rb") as fh:
            text = fh.read()
    except OSError as err:
        raise TsFileFormatError(f"{path}: cannot read the manifest ({err})") from err
    return parse_manifest(text, path)


class _Manifests:
    """The manifests found so far, by directory (one lookup per directory and check)."""

    def __init__(self):
        self._by_dir: dict[str, str | None] = {}
        self._loaded: dict[str, dict[str, ManifestEntry]] = {}

    def nearest(self, directory: str) -> str | None:
        """Return the manifest in ``directory`` or the nearest directory above it."""
        if directory not in self._by_dir:
            candidate = os.path.join(directory, MANIFEST_NAME)
            parent = os.path.dirname(directory)
            if os.path.isfile(candidate):
                self._by_dir[directory] = candidate
            else:
                self._by_dir[directory] = None if parent == directory else self.nearest(parent)
        return self._by_dir[directory]

    def lookup(self, path: str) -> tuple[str, ManifestEntry | None] | None:
        """Return ``(manifest path, entry or None when unlisted)``; None without a manifest."""
        manifest = self.nearest(os.path.dirname(path))
        if manifest is None:
            return None
        if manifest not in self._loaded:
            self._loaded[manifest] = _load(manifest)
        rel = os.path.relpath(path, os.path.dirname(manifest)).replace(os.sep, "/")
        return manifest, self._loaded[manifest].get(rel)


@dataclass
class ManifestCheck:
    """What :func:`check_manifests` found.

    Attributes:
        problems: files whose size or content differs from their manifest.
        identities: source key -> identity carrying the verified content hash.
        checked: names of the files checked (and found as listed).
        unlisted: names of files a manifest applies to but does not list.
    """

    problems: list[FileProblem] = field(default_factory=list)
    identities: dict[str, FileIdentity] = field(default_factory=dict)
    checked: list[str] = field(default_factory=list)
    unlisted: list[str] = field(default_factory=list)


def check_manifests(sources: Sequence[Source], force: bool = False) -> ManifestCheck:
    """Check every source a manifest lists against it (see the module notes).

    Args:
        sources: sources of any kind; only local files are looked up.
        force: hash every listed file, even one whose hash is remembered (``verify``).

    Raises:
        TsFileFormatError: a manifest cannot be read or uses another algorithm.
    """
    out = ManifestCheck()
    manifests = _Manifests()
    todo: list[tuple[Source, str, ManifestEntry]] = []
    for source in sources:
        path = source.local_path()
        found = manifests.lookup(path) if path is not None else None
        if found is None:
            continue
        manifest, entry = found
        if entry is None:
            out.unlisted.append(source.name)
        else:
            todo.append((source, manifest, entry))
    if not todo:
        return out
    with ThreadPoolExecutor(min(_HASH_THREADS, len(todo))) as pool:
        for problem, identity, source in pool.map(lambda job: _check_one(*job, force), todo):
            out.checked.append(source.name)
            if problem is not None:
                out.problems.append(problem)
            else:
                out.identities[source.key] = identity
    return out


#: what to do when a listed file was changed on purpose
_REWRITE_HINT = (
    "; if you changed it on purpose, write the manifest again (tsfile-torch manifest DIR)"
)


def _check_one(source: Source, manifest: str, entry: ManifestEntry, force: bool):
    """Return (problem or None, verified identity, source)."""
    try:
        identity = source.identity()
        if identity.size != entry.size:
            return (
                FileProblem(
                    source.name,
                    f"size {identity.size} differs from the manifest's {entry.size} "
                    f"({manifest}): the file was changed, truncated or replaced since the "
                    f"manifest was written{_REWRITE_HINT}",
                ),
                None,
                source,
            )
        key = source.index_key(identity)
        digest = file_hash(source.local_path(), source.name, identity.fields, key, force)
    except TsFileFormatError as err:
        return FileProblem.of(source.name, err), None, source
    except OSError as err:
        return FileProblem(source.name, f"cannot hash the file ({err})"), None, source
    if digest != entry.hash:
        return (
            FileProblem(
                source.name,
                f"content differs from the manifest {manifest} ({ALGORITHM} {digest[:16]}..., "
                f"listed {entry.hash[:16]}...): the file is damaged or was changed since the "
                f"manifest was written{_REWRITE_HINT}",
            ),
            None,
            source,
        )
    return None, dataclasses.replace(identity, content=digest), source

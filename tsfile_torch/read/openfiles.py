"""OpenFiles: the TsFile readers one process has open, at most ``max_open_files`` of them.

Readers open on first use with the dataset's backend captured (Note: backend capture in
:mod:`tsfile_torch.native.backend`) and stay open across epochs (Note: readers live in the
process that uses them). Past ``max_open_files`` the least recently used reader is closed (an mmap
reader unmaps its file then), together with the series handles prepared on it; it reopens when
needed again. 10,000 files thus work under ``ulimit -n 1024``.

Which backend a reader really got is looked up only when :meth:`OpenFiles.backends` is asked,
with one scan of ``/proc/self/maps`` for all open files, except that the first ``mmap`` open of
a process checks that tsfile did map the file (:class:`~tsfile_torch.errors.MappingError`).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence

from tsfile_torch.catalog.build import FileInfo, ReadGroup
from tsfile_torch.native.backend import mapped_paths, open_reader
from tsfile_torch.native.errors import NATIVE_ERRORS
from tsfile_torch.native.guard import guarded_call
from tsfile_torch.native.malloc import tune_malloc
from tsfile_torch.native.queries import prepare_handles
from tsfile_torch.options import DEFAULT_MAX_OPEN_FILES

__all__ = ["DEFAULT_MAX_OPEN_FILES", "OpenFiles"]

logger = logging.getLogger(__name__)


class OpenFiles:
    """An LRU of open ``TsFileReader`` objects and the series handles prepared on them.

    Args:
        files: the catalog's files (index = position).
        read_backend: ``"auto"``, ``"mmap"`` or ``"pread"``.
        max_open_files: readers kept open at once (at least 1).
        malloc_tuning: call :func:`tune_malloc` before the first open.
    """

    def __init__(
        self,
        files: Sequence[FileInfo],
        read_backend: str,
        max_open_files: int = DEFAULT_MAX_OPEN_FILES,
        malloc_tuning: bool = True,
    ):
        self.files = files
        self.read_backend = read_backend
        self.max_open_files = max(1, max_open_files)
        self.malloc_tuning = malloc_tuning
        self.pid = os.getpid()
        #: Native opens done so far (reopens after eviction included).
        self.open_count = 0
        self._readers: OrderedDict[int, object] = OrderedDict()
        self._handles: dict[int, dict[int, list]] = {}  # file -> group -> prepared handles
        self._opened: dict[int, object] = {}  # file -> its identity when its reader opened
        self._lock = threading.RLock()
        self._mapping_checked = False

    def __getstate__(self):
        raise TypeError("OpenFiles holds native readers and cannot be pickled")

    def __len__(self) -> int:
        return len(self._readers)

    def is_open(self, file_index: int) -> bool:
        """Whether file ``file_index`` has an open reader here."""
        return file_index in self._readers

    def reader(self, file_index: int):
        """Return the open reader of ``file_index``, opening it (and maybe closing the LRU one)."""
        if self.pid != os.getpid():
            raise RuntimeError(
                "readers used in a process other than the one that opened them; each process "
                "must open its own (the datasets do this for you)"
            )
        with self._lock:
            reader = self._readers.get(file_index)
            if reader is not None:
                self._readers.move_to_end(file_index)
                return reader
            while len(self._readers) >= self.max_open_files:
                self._close(next(iter(self._readers)))
            if self.malloc_tuning:
                tune_malloc()
            info = self.files[file_index]
            check = self.read_backend == "mmap" and not self._mapping_checked
            # the reader opens the file the catalog describes, unchanged during the open
            reader, _ = guarded_call(  # Note: guarded read
                info,
                "opening as a TsFile",
                lambda: open_reader(info.source, self.read_backend, check_mapped=check),
                release=lambda opened: self._close_reader(info, opened[0]),
                translate=False,  # open_reader names and translates its own errors
            )
            self._mapping_checked = self._mapping_checked or check
            self.open_count += 1
            self._readers[file_index] = reader
            self._opened[file_index] = info.identity
            logger.debug("opened %s (%s, pid %d)", info.name, self.read_backend, self.pid)
            return reader

    def handles(self, group_index: int, group: ReadGroup) -> tuple[object, list]:
        """Return ``(reader, handles)``: the group's series prepared once on its open reader."""
        with self._lock:
            reader = self.reader(group.file_index)
            per_file = self._handles.setdefault(group.file_index, {})
            handles = per_file.get(group_index)
            if handles is None:
                handles = per_file[group_index] = self._prepare(reader, group)
            return reader, handles

    def _prepare(self, reader, group: ReadGroup) -> list:
        info = self.files[group.file_index]
        return prepare_handles(reader, group.file_index, info.nbytes, info.name, group.shards)

    def opened_identity(self, file_index: int):
        """Return the identity of the file as its open reader was opened on (``None``: not open).

        What was learned through that reader belongs to this identity (Note: index cache).
        """
        return self._opened.get(file_index)

    def _close(self, file_index: int) -> None:
        reader = self._readers.pop(file_index)
        self._handles.pop(file_index, None)
        self._opened.pop(file_index, None)
        self._close_reader(self.files[file_index], reader)

    @staticmethod
    def _close_reader(info: FileInfo, reader) -> None:
        try:
            reader.close()
        except NATIVE_ERRORS:  # closing is best effort: the file may be gone or damaged
            logger.debug("closing %s failed", info.name, exc_info=True)

    def close(self) -> None:
        """Close every reader (they reopen on the next use)."""
        with self._lock:
            for file_index in list(self._readers):
                self._close(file_index)

    def backends(self) -> dict[int, str]:
        """Return file index -> backend its open reader really uses (``"mmap"`` / ``"pread"``).

        On Linux this reads ``/proc/self/maps`` once; elsewhere it reports what was asked.
        """
        with self._lock:
            open_files = list(self._readers)
        mapped = mapped_paths()
        out = {}
        for i in open_files:
            path = self.files[i].source.mapped_path()
            if self.read_backend == "pread" or path is None:
                out[i] = "pread"
            elif mapped is None:
                out[i] = self.read_backend
            else:
                out[i] = "mmap" if path in mapped else "pread"
        return out

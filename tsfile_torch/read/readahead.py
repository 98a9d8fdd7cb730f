"""ReadAhead: a reader's decoding ahead of its caller (Note: read-ahead).

Note: read-ahead. Sequential reads decode ahead of the caller on background threads (the native
decode releases the GIL), so decoding overlaps whatever the caller does between batches (a
training step): after a read, the next block of every group it touched is decoded in the
background when the cache has room for it; a read that needs a block being decoded ahead waits
for it, and decodes itself, on its decode threads beside the other blocks it misses, the blocks
whose decode ahead no thread has started yet (the read-ahead has fewer threads: it leaves a core
to the caller). In a process's first pass, the first read of a group whose block is large
decodes only the rows asked for (:data:`FIRST_BLOCK_ROWS` or fewer) and leaves the whole block
to the background, so the first batch of a run costs about one batch's decode, not a block's
(benchmarks/RESULTS.md, "What each mechanism pays": "first_read"). Later passes do not: those
rows are decoded twice, and a later epoch's first batch follows a training step, not a
start-up.

A sequential streaming pass (the view says so: :attr:`ReadAhead.next_pass`) also decodes ahead
for the pass after it: once a read reaches the last block of a group in range, the block that
pass will begin with is decoded in the background (when the cache has room for it beside the
blocks in use) and handed to that pass. Streaming keeps no rows from one pass to the next, so
without this every block of a file shorter than a block (the reference workload) is decoded at
the start of an epoch, while the training step waits; with it, that decode overlaps the steps of
the pass before.

A decode ahead (one the caller does not wait for) never touches a mapping: a mapped file
truncated while a background decode touches its pages would kill the process with SIGBUS, where
a read in the caller's thread checks the file first and reports the change (the caller's decode
threads, which it waits for, read the mapping as its own thread would). Files the caller reads
through pread (``read_backend="pread"``, or sources that cannot be mapped) are decoded ahead
through the caller's readers; mapped files (``"auto"``, ``"mmap"``) through readers of their
own, opened with pread on first use (one more open file descriptor each, where a mapped reader
keeps none; no second mapping) and closed with the reader. They are used only while both kinds
fit ``max_open_files`` (at most half as many files selected), and a file whose pread reader
cannot open (too many open files) is read without read-ahead, never an error. A file changed
under a decode ahead is an error when the caller takes that block, as with pread. Off when more
files are selected than may be open at once (an open-file eviction must not close a reader a
decode uses).

Note: read-ahead and fork. A process forked while a decode ahead runs (a DataLoader starting
fork workers right after a pass in the main process) would copy a decode half done: native
locks held by a thread the child does not have, and futures no thread will finish. So a fork
waits for the decodes ahead running then (``os.register_at_fork``: they run through their
reader's gate, which the forking thread closes before the fork and reopens after; two threads
may fork at once), and the child drops what every reader copied (pools without threads, pending
decodes) and starts its own threads when it reads. The caller's own decode threads are idle
whenever its thread forks. A URL's download is done before the gate (``Source.prepare``): a fork
never waits on the network.

Note: an error stops its read-ahead. A read that raises (a damaged block, memory run out, a
KeyboardInterrupt) first cancels the decodes ahead that no thread has started and waits for the
running ones (:func:`stopping_on_error` on the reader's reads, :meth:`ReadAhead.stop`), and a
read's own decode threads are all waited for before one's error is raised: no decode runs on
in the background once the error has reached the caller (a process ending on that error would
tear down the interpreter under a native decode). A thread that cannot start (``can't start new
thread``: memory short) is no error either: the read decodes in its own thread and this reader
stops decoding ahead."""

from __future__ import annotations

import functools
import logging
import os
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor, wait

from tsfile_torch import mechanisms
from tsfile_torch.catalog.build import ReadGroup
from tsfile_torch.errors import TsFileTorchError
from tsfile_torch.pids import usable_cpus
from tsfile_torch.read.blockcache import Block
from tsfile_torch.read.openfiles import OpenFiles

__all__ = ["FIRST_BLOCK_ROWS", "ReadAhead", "local_rows", "stopping_on_error"]

logger = logging.getLogger(__name__)

#: Rows a pass decodes first, alone, of a group whose block is at least twice as long (Note:
#: read-ahead): about one batch.
FIRST_BLOCK_ROWS = 8192


def local_rows(group: ReadGroup, start_row: int, stop_row: int) -> tuple[int, int]:
    """Return the group-local rows of ``[start_row, stop_row)`` (empty when lo >= hi)."""
    return (
        max(start_row, group.start_row) - group.start_row,
        min(stop_row, group.stop_row) - group.start_row,
    )


def stopping_on_error(read):
    """Decorate a reader's read method: an error it raises first stops the reader's read-ahead
    (Note: an error stops its read-ahead)."""

    @functools.wraps(read)
    def stopping(reader, *args, **kwargs):
        try:
            return read(reader, *args, **kwargs)
        except BaseException:
            reader.ahead.stop()
            raise

    return stopping


class ReadAhead:
    """The decoding ahead of one :class:`~tsfile_torch.read.reader.BatchReader` (see the
    module notes): blocks decoded in the background, the pass's first reads decoded small, how
    long the caller spends between reads, and the blocks one read needs decoded at once on the
    decode threads (:meth:`prefetch`).

    Args:
        reader: the reader it decodes for (its catalog, cache, decoder and block layout).
        max_open_files: the reader's open-file limit (more files: no read-ahead).
    """

    def __init__(self, reader, max_open_files: int):
        self.reader = weakref.proxy(reader)  # the reader holds this: no reference cycle
        self.gate = _Gate()  # entered by each decode ahead, closed across a fork (see the notes)
        self.decode_pool: ThreadPoolExecutor | None = None  # the decode threads of one read
        _LIVE.add(self)
        catalog = reader.catalog
        self.on = len(catalog.files) <= max_open_files
        #: mapped files are decoded ahead through pread readers when both kinds fit the limit
        self.side_ok = 2 * len(catalog.files) <= max_open_files
        self.no_side: set[int] = set()  # files whose pread reader could not open
        #: files the caller reads through pread: decoded ahead through the caller's readers
        self.unmapped = [
            reader.read_backend == "pread" or info.source.mapped_path() is None
            for info in catalog.files
        ]
        #: pread readers of the mapped files, for the decodes ahead (see the module notes)
        self.side: OpenFiles | None = None
        self.pending: dict[tuple[int, int], tuple[Future, int]] = {}  # key -> (decode, bytes)
        self.pool: ThreadPoolExecutor | None = None
        self.begun: set[int] = set()  # groups read since the pass began
        self.later: list[tuple[int, int]] = []  # blocks to decode ahead once a read is done
        self.heads: dict[tuple[int, int], Block] = {}  # first reads, decoded small
        #: the first pass of the process (see the module notes)
        self.small_first = mechanisms.on("first_read")
        #: the pass is sequential and keeps nothing: decode the next pass's first blocks
        self.next_pass = False
        self.first: dict[int, int] = {}  # group -> the block this pass began with
        self.next: dict[tuple[int, int], tuple[Future, int]] = {}  # the next pass's blocks
        #: a thread could not start (memory short): decode in the caller's thread from now on
        self.threadless = False

    def holds(self, key) -> bool:
        """Whether block ``key`` is being decoded ahead or was decoded small."""
        return key in self.pending or key in self.heads

    def first_reads(self, start_row: int, stop_row: int, groups: list[int]) -> None:
        """Decode the pass's first read of each group whose block is large as only the rows
        asked (on the decode threads: ``self.heads``); the blocks follow in the background."""
        r = self.reader
        plans = []
        for gi in groups:
            if gi in self.begun:
                continue
            self.begun.add(gi)
            group = r.catalog.groups[gi]
            if not self.small_first or not self._background(group.file_index):
                continue
            local_lo, local_hi = local_rows(group, start_row, stop_row)
            if local_lo >= local_hi:
                continue
            needs = list(r._block_needs(group, local_lo, local_hi))
            if len(needs) != 1:
                continue
            b, need_lo, need_hi, lo, hi = needs[0]
            small = need_hi - need_lo <= FIRST_BLOCK_ROWS and hi - lo >= 2 * FIRST_BLOCK_ROWS
            if small and lo <= need_lo and need_hi <= hi and (gi, b) not in r.cache:
                plans.append(((gi, b), r.decoder.plan(gi, need_lo, need_hi)))
        self.heads.update(self._decode_all(plans))

    def prefetch(self, start_row: int, stop_row: int, groups: list[int]) -> None:
        """Decode the missing blocks of ``[start_row, stop_row)`` on ``decode_threads`` threads.

        Readers are opened and indexes built here, in the calling thread; the threads only
        decode. Skipped when the blocks would not all fit the cache (they would be decoded
        again) or when they span more files than may be open at once.
        """
        r = self.reader
        needs = []
        for gi in groups:
            group = r.catalog.groups[gi]
            local_lo, local_hi = local_rows(group, start_row, stop_row)
            needs.extend((gi, *need) for need in r._block_needs(group, local_lo, local_hi))
        self.prefetch_blocks(needs)

    def prefetch_blocks(self, needs) -> None:
        """:meth:`prefetch` of ``(group, block, need_lo, need_hi, lo, hi)`` tuples (what
        :meth:`BatchReader._block_needs` yields, with the group first): the blocks a gather
        touches, wherever they are."""
        r = self.reader
        missing, nbytes, files = [], 0, set()
        for gi, b, need_lo, need_hi, lo, hi in needs:
            group = r.catalog.groups[gi]
            key = (gi, b)
            queued = key in self.pending and not self.pending[key][0].running()
            if key not in r.cache and (queued or not self.holds(key)):
                if need_lo < lo or need_hi > hi:
                    return  # rows outside set_range: let the serial path handle them
                missing.append(((gi, b), gi, lo, hi))
                nbytes += (hi - lo) * (len(group.columns) * r.dtype.itemsize + 8)
                files.add(group.file_index)
        too_many_files = len(files) > r.files.max_open_files
        if len(missing) < 2 or nbytes > r.cache.capacity or too_many_files:
            return
        # decodes ahead still queued are decoded here instead, beside the others (the caller
        # waits for them now: the decode threads are faster than the read-ahead's queue)
        missing = [m for m in missing if m[0] not in self.pending or self._unqueue(m[0])]
        plans = [(key, r.decoder.plan(gi, lo, hi)) for key, gi, lo, hi in missing]
        for key, data in self._decode_all(plans):
            r.cache.put(key, data)

    def _unqueue(self, key) -> bool:
        """Take back the decode ahead of ``key`` if no thread has started it."""
        if not self.pending[key][0].cancel():
            return False
        del self.pending[key]
        return True

    def _decode_all(self, plans: list) -> list:
        """Return [(key, block)] for planned reads (key, plan), decoded on the decode threads
        when there are several of both (plans are made in the calling thread: opens, indexes).
        One decode's error is raised once every other decode has ended (Note: an error stops
        its read-ahead)."""
        r = self.reader
        if len(plans) < 2 or r.decode_threads < 2 or self.threadless:
            return [(key, r.decoder.decode(plan)) for key, plan in plans]
        if self.decode_pool is None:
            name = "tsfile-decode"
            self.decode_pool = ThreadPoolExecutor(r.decode_threads, thread_name_prefix=name)
        futures: list[Future] = []
        try:
            for _, plan in plans:
                futures.append(self.decode_pool.submit(r.decoder.decode, plan))
        except RuntimeError as err:  # can't start new thread: decode here (see the notes)
            self._threads_failed(err)
            _settle(futures)
            return [(key, r.decoder.decode(plan)) for key, plan in plans]
        try:
            return [(key, f.result()) for (key, _), f in zip(plans, futures, strict=True)]
        except BaseException:
            _settle(futures)
            raise

    def _threads_failed(self, err: RuntimeError) -> None:
        """A thread of a pool could not start: cancel what no thread started, decode in the
        caller's thread from now on (Note: an error stops its read-ahead)."""
        logger.debug("read-ahead off: a decode thread could not start (%s)", err)
        self.threadless = True
        for pool in (self.pool, self.decode_pool):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)  # running ones are waited for
        for into in (self.pending, self.next):
            for key in [k for k, (f, _) in into.items() if f.cancelled()]:
                del into[key]

    def decode_ahead(self, gi: int, b: int, for_next: bool = False) -> bool:
        """Start decoding block ``b`` of group ``gi`` in the background (``for_next``: for the
        next pass), if it is missing, in range and fits the cache beside what is there and
        what is being decoded; return whether the block is missing and in range."""
        r = self.reader
        group = r.catalog.groups[gi]
        key = (gi, b)
        into = self.next if for_next else self.pending
        lo, hi = r._block_rows_of(group, b)
        if lo >= hi:
            return False
        if key in into or (key in r.cache and not for_next):
            return True
        if not self._background(group.file_index) or self.threadless:
            return True
        nbytes = (hi - lo) * (len(group.columns) * r.dtype.itemsize + 8)
        pending = sum(n for _, n in [*self.pending.values(), *self.next.values()])
        if r.cache.nbytes + pending + nbytes > r.cache.capacity:
            return True
        files = self._files(group.file_index)
        span = r.decoder.span(gi, lo, hi)  # indexes: in this thread
        if self.pool is None:
            threads = max(1, min(r.decode_threads, usable_cpus() - 1))
            self.pool = ThreadPoolExecutor(threads, thread_name_prefix="tsfile-read-ahead")
        try:
            into[key] = (self.pool.submit(self._decode_gated, gi, lo, hi, span, files), nbytes)
        except RuntimeError as err:  # can't start new thread: no more decoding ahead
            self._threads_failed(err)
        return True

    def _decode_gated(self, gi: int, lo: int, hi: int, span, files: OpenFiles) -> Block | None:
        """Decode rows ``[lo, hi)`` of group ``gi`` through ``files`` in the background; None:
        nothing to take (the reader is gone, or the file's pread reader would not open: the
        caller then decodes the block itself)."""
        try:  # a download is no native work: done before the gate, a fork never waits on it
            r = self.reader
            index = r.catalog.groups[gi].file_index
            if not files.is_open(index):
                r.catalog.files[index].source.prepare()
        except ReferenceError:
            return None
        except (TsFileTorchError, OSError):
            pass  # the open below meets it again, and says so
        with self.gate:  # a fork waits for this decode (Note: read-ahead and fork)
            try:
                r = self.reader
                if files is not r.files:  # a pread reader of a mapped file: opened here, once
                    try:
                        files.reader(r.catalog.groups[gi].file_index)
                    except (TsFileTorchError, OSError) as err:
                        self.no_side.add(r.catalog.groups[gi].file_index)
                        logger.debug("no read-ahead for group %d: %s", gi, err)
                        return None
                return r.decoder.decode(r.decoder.plan(gi, lo, hi, files, span))
            except ReferenceError:  # the reader is gone: nobody will take this block
                return None

    def _background(self, file_index: int) -> bool:
        """Whether ``file_index`` may be decoded ahead (see the module notes)."""
        if self.unmapped[file_index]:
            return True
        return self.side_ok and file_index not in self.no_side

    def _files(self, file_index: int) -> OpenFiles:
        """The readers a background decode of ``file_index`` goes through (never a mapping)."""
        r = self.reader
        if self.unmapped[file_index]:
            return r.files
        if self.side is None:
            files = r.files
            self.side = OpenFiles(files.files, "pread", files.max_open_files, files.malloc_tuning)
        return self.side

    def take(self, key) -> Block | None:
        """Return block ``key`` if it is being decoded ahead (waiting for it), stored."""
        r = self.reader
        pending = self.pending.pop(key, None)
        if pending is None or pending[0].cancelled():
            return None
        block = pending[0].result()  # a failed decode raises here, as it would have inline
        if block is not None:
            r.cache.put(key, block)
        return block

    def after_read(self, groups: list[int], start_row: int, stop_row: int) -> None:
        """Decode ahead the blocks a first read left out, then the block after the last one a
        read touched, in each of its groups; past a group's last block, the block the next
        pass begins with (:attr:`next_pass`)."""
        r = self.reader
        later, self.later = self.later, []
        for gi, b in later:
            self.decode_ahead(gi, b)
        for gi in groups:
            group = r.catalog.groups[gi]
            if self.next_pass and gi not in self.first:
                self.first[gi] = local_rows(group, start_row, stop_row)[0] // r.block_rows
            local = min(stop_row, group.stop_row) - group.start_row
            after = (local - 1) // r.block_rows + 1
            if local > 0 and not self.decode_ahead(gi, after) and self.next_pass:
                # only once this pass's last block is decoded: before, it would take a core
                # from the blocks this pass waits for
                if (gi, after - 1) in r.cache:
                    self.decode_ahead(gi, self.first[gi], for_next=True)

    def new_pass(self, keep_next: bool = False) -> None:
        """Wait for the decodes ahead and drop their blocks (a new pass, a new range, close);
        ``keep_next``: the blocks decoded for this new pass are kept for it."""
        r = self.reader
        for head in self.heads.values():
            r.cache.recycle(head)
        self.heads.clear()
        ahead, self.pending = self.pending, {}
        if keep_next:
            self.pending, self.next = self.next, {}
        else:
            ahead.update(self.next)
            self.next = {}
        for future, _ in ahead.values():
            if not future.cancel():
                try:
                    block = future.result()
                except (TsFileTorchError, OSError, MemoryError):  # never asked for
                    continue
                if block is not None:
                    r.cache.recycle(block)
        if self.begun:
            self.small_first = False  # a pass has read: later passes decode whole blocks
        self.begun.clear()
        self.first.clear()

    def stop(self) -> None:
        """A read raised: cancel the decodes ahead that no thread has started, wait for the
        running ones and drop what they decoded (Note: an error stops its read-ahead); the
        reader can read on (it decodes what it needs, and decodes ahead again after that)."""
        r = self.reader
        ahead = [*self.pending.values(), *self.next.values()]
        self.pending, self.next = {}, {}
        self.later.clear()
        for head in self.heads.values():
            r.cache.recycle(head)
        self.heads.clear()
        for future, _ in ahead:
            future.cancel()
        for future in _settle([f for f, _ in ahead]):
            if future.result() is not None:
                r.cache.recycle(future.result())

    def close(self) -> None:
        """Stop decoding ahead (the reader closes)."""
        self.new_pass()
        for pool in (self.pool, self.decode_pool):
            if pool is not None:
                pool.shutdown(wait=True)
        self.pool = self.decode_pool = None
        if self.side is not None:
            self.side.close()

    def forked(self) -> None:
        """In a forked child: drop the parent's threads and decodes (Note: read-ahead and fork)."""
        self.gate = _Gate()
        self.pool = self.decode_pool = None  # their threads are the parent's
        self.pending, self.next = {}, {}  # decodes no thread here will finish
        self.later.clear()


def _settle(futures: list[Future]) -> list[Future]:
    """Cancel ``futures`` not started, wait for the running ones; return those that ended
    with a result (their errors are dropped: an error is on its way to the caller already)."""
    for future in futures:
        future.cancel()
    wait(futures)
    return [f for f in futures if not f.cancelled() and f.exception() is None]


class _Gate:
    """Decodes ahead run through it side by side; a fork closes it: new decodes wait and the
    fork waits for the running ones to end (Note: read-ahead and fork)."""

    def __init__(self):
        self._cond = threading.Condition(threading.Lock())
        self._running = 0
        self._closed = 0  # forks under way (two threads may fork at once)

    def __enter__(self) -> None:
        with self._cond:
            while self._closed:
                self._cond.wait()
            self._running += 1

    def __exit__(self, *exc) -> None:
        with self._cond:
            self._running -= 1
            if not self._running:
                self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed += 1
            try:
                while self._running:
                    self._cond.wait()
            except BaseException:  # interrupted (Ctrl-C): left open, the fork goes on
                self._closed -= 1
                self._cond.notify_all()
                raise

    def reopen(self) -> None:
        with self._cond:
            self._closed -= 1
            self._cond.notify_all()


#: the ReadAhead objects of this process (Note: read-ahead and fork)
_LIVE: weakref.WeakSet = weakref.WeakSet()
_FORKING = threading.local()  # the gates this thread closed for its fork


def _before_fork() -> None:
    _FORKING.closed = []
    for ahead in list(_LIVE):
        ahead.gate.close()  # the decodes running now end first
        _FORKING.closed.append(ahead)


def _after_fork_in_parent() -> None:
    closed, _FORKING.closed = getattr(_FORKING, "closed", []), []
    for ahead in closed:
        ahead.gate.reopen()


def _after_fork_in_child() -> None:
    _FORKING.closed = []
    for ahead in list(_LIVE):  # every one: their threads are the parent's
        ahead.forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )

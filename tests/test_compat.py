"""Every private internal in tsfile_torch/compat.py is still what it was checked to be.

One test per entry of ``compat.INTERNALS``, run against the installed torch, torchdata and
CPython: each fails (never skips) when the internal is renamed, moved or behaves otherwise.
A last test keeps the names out of every other module of the package.
"""

from __future__ import annotations

import multiprocessing
import os
import secrets
import tokenize
import warnings
from pathlib import Path

import pytest
import torch.utils.data as tud

from tsfile_torch import TsFileIterableDataset, compat

PACKAGE = Path(compat.__file__).parent


class _Items(tud.IterableDataset):
    def __iter__(self):
        return iter(range(8))


def _multiprocess_iterator(**kwargs):
    loader = tud.DataLoader(_Items(), num_workers=2, persistent_workers=True, **kwargs)
    it = iter(loader)
    next(it)
    return loader, it


def test_every_entry_names_its_versions_and_what_is_lost_without_it():
    for key, entry in compat.INTERNALS.items():
        assert entry.names and entry.used_by and entry.checked_on and entry.missing, key
    names = [n for e in compat.INTERNALS.values() for n in e.names]
    assert len(names) == len(set(names))
    assert len(names) <= 8  # the limit shared/DESIGN.md sets


def test_fetcher_torchs_iterable_fetcher_is_found_by_name_and_says_it_batches(small_dir):
    from torch.utils.data._utils import fetch

    assert fetch._IterableDatasetFetcher.__name__ == "_IterableDatasetFetcher"
    assert fetch._IterableDatasetFetcher(_Items(), True, None, False).auto_collation is True
    ds = TsFileIterableDataset(small_dir, batch_size=1000)
    with pytest.raises(ValueError, match="would stack them again"):
        next(iter(tud.DataLoader(ds, batch_size=2)))
    assert next(iter(tud.DataLoader(ds, batch_size=None))).shape[0] == 1000


def test_worker_pids_are_registered_by_torch_and_forgotten_before_ending_workers():
    from torch.utils.data._utils import signal_handling

    assert callable(signal_handling._remove_worker_pids)
    loader, it = _multiprocess_iterator()
    assert it._worker_pids_set is True
    compat.forget_worker_pids(it)
    assert it._worker_pids_set is False
    with pytest.raises((ValueError, RuntimeError)):  # torch no longer knows them
        signal_handling._remove_worker_pids(id(it))
    workers = compat.iterator_workers(it)
    for w in workers:
        w.kill()  # no "killed by signal" from torch's SIGCHLD handler
    compat.shutdown_workers(it)
    assert not any(w.is_alive() for w in workers)


_SHUT: list[int] = []


def _record_shutdown(it) -> None:
    _SHUT.append(id(it))


def test_iterator_the_loader_keeps_its_iterator_whose_workers_are_processes():
    loader, it = _multiprocess_iterator()
    assert compat.current_iterator(loader) is it  # persistent workers
    workers = compat.iterator_workers(it)
    assert len(workers) == 2
    assert all(isinstance(w, multiprocessing.process.BaseProcess) for w in workers)
    _SHUT.clear()
    compat.wrap_shutdown(it, _record_shutdown)
    compat.wrap_shutdown(it, _record_shutdown)  # once per iterator class
    compat.drop_iterator(loader, it)
    assert compat.current_iterator(loader) is None
    compat.shutdown_workers(it)
    assert _SHUT == [id(it)]
    assert not any(w.is_alive() for w in workers)
    single = iter(tud.DataLoader(_Items()))
    assert compat.iterator_workers(single) == []  # the single-process iterator has none


def test_posix_shm_makes_tracks_and_unlinks_a_segment():
    assert os.name == "posix"  # the platforms this suite runs on have it (Windows: None)
    shm, tracker = compat.posix_shm()
    name = f"/tsfile-torch-compat-{secrets.token_hex(4)}"
    tracker.ensure_running()
    tracker.register(name, "shared_memory")
    fd = shm.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        assert os.fstat(fd).st_mode & 0o777 == 0o600
    finally:
        os.close(fd)
        shm.shm_unlink(name)
        tracker.unregister(name, "shared_memory")
    with pytest.raises(FileNotFoundError):
        shm.shm_unlink(name)


def test_a_missing_internal_warns_once_and_turns_only_its_mechanism_off(monkeypatch):
    from torch.utils.data._utils import signal_handling

    loader, it = _multiprocess_iterator()
    try:
        monkeypatch.delattr(signal_handling, "_remove_worker_pids")
        compat._warn_missing.cache_clear()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            compat.forget_worker_pids(it)
            compat.forget_worker_pids(it)
        assert [w.category for w in caught] == [compat.CompatWarning]
        assert "_remove_worker_pids" in str(caught[0].message)
        assert "killed by signal" in str(caught[0].message)
        assert it._worker_pids_set is True  # left to torch: nothing else turned off
    finally:
        compat._warn_missing.cache_clear()
        monkeypatch.undo()
        del loader, it


def test_the_native_symbols_listed_are_the_fork_fixs():
    from tsfile_torch.native import forkfix

    symbols = (forkfix._POOL_SYMBOL, forkfix._INIT_SYMBOL, forkfix._SIZE_SYMBOL)
    assert compat.NATIVE_SYMBOLS == symbols


#: code names (not strings or comments) of the internals compat reaches, and of those it
#: replaced with public routes (torch's fetcher classes, pin_memory module, frame walks...)
_PRIVATE = {
    "_posixshmem",
    "resource_tracker",
    "_finalizer_registry",
    "_remove_temp_dir",
    "_SIGCHLD_handler_set",
    "_set_SIGCHLD_handler",
    "_remove_worker_pids",
    "_worker_pids_set",
    "_index_queues",
    "_getframe",
    "_MapDatasetFetcher",
    "_IterableDatasetFetcher",
    "python_exit_status",
    "_get_iterator",
    "_auto_collation",
    "_index_sampler",
}
#: names a class of ours may use for itself too: flagged on another object (``x._workers``)
_ATTRIBUTES = {"_callback", "_thread", "_workers", "_iterator", "_shutdown_workers", "_utils"}


def _private_uses(path: Path) -> list[str]:
    found, previous = [], []
    with path.open("rb") as fh:
        for tok in tokenize.tokenize(fh.readline):
            if tok.type in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT):
                continue
            text, where = tok.string, f"{path.relative_to(PACKAGE)}:{tok.start[0]}"
            if tok.type == tokenize.NAME and text in _PRIVATE:
                found.append(f"{where} {text}")
            elif tok.type == tokenize.NAME and text in _ATTRIBUTES:
                owner = previous[-2].string if len(previous) >= 2 else ""
                if previous and previous[-1].string == "." and owner not in ("self", "cls"):
                    found.append(f"{where} {owner}.{text}")
            elif tok.type == tokenize.STRING and ("_snapshot" in text or "._utils" in text):
                found.append(f"{where} {text}")
            previous = [*previous[-1:], tok]
    return found


def test_no_other_module_of_the_package_names_a_private_internal():
    paths = [p for p in sorted(PACKAGE.rglob("*.py")) if p.name != "compat.py"]
    assert [use for path in paths for use in _private_uses(path)] == []
    assert _private_uses(PACKAGE / "compat.py")  # the scan finds them where they are


class _Pinnable:
    def pin_memory(self):
        return "pinned"


def test_pinning_through_public_calls_keeps_the_batch_structure():
    """torch's private pin_memory module replaced: each part's own ``pin_memory()``, the
    structure around it kept (tensors: tests/test_pin_memory.py, where an accelerator is)."""
    from tsfile_torch.loader import pinned

    batch = {"x": _Pinnable(), "pair": (_Pinnable(), "name", 3), "list": [_Pinnable()]}
    assert pinned(batch) == {"x": "pinned", "pair": ("pinned", "name", 3), "list": ["pinned"]}

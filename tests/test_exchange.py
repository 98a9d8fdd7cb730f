"""The block exchange (Note: block exchange in tsfile_torch.read.exchange): fork workers of a
streaming shuffled loader decode each block of a pass once between them, exactly, with nothing
left behind and no wait on a worker that died or stopped."""

from __future__ import annotations

import os
import pickle
import signal
import time

import numpy as np
import pytest
import torch

from tsfile_torch import MixedWindows, TsFileIterableDataset, TsFileWindowDataset, make_loader
from tsfile_torch.read import core as core_module
from tsfile_torch.read import exchange as exchange_module
from tsfile_torch.read.blockcache import Block
from tsfile_torch.read.exchange import BUSY, BlockExchange

GROUPS = 6  # the small dataset: 3 files x 2 devices, 5,000 rows each


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


@pytest.mark.parametrize("persistent", [True, False])
def test_shuffled_streaming_workers_decode_each_block_once_and_hand_out_exact_rows(
    tmp_path, small_dir, small_expected, decode_counting, persistent
):
    before = _shm()
    # 5 blocks of 1,024 rows per group: one shuffle buffer, so every batch of both workers
    # gathers from every block (without the exchange both workers decode all of them)
    ds = decode_counting(
        small_dir, tmp_path, batch_size=700, shuffle=True, seed=4, block_rows=1024,
        return_timestamps=True,
    )  # fmt: skip
    loader = make_loader(
        ds, num_workers=2, multiprocessing_context="fork", persistent_workers=persistent
    )
    for epoch in range(3):
        ds.set_epoch(epoch)
        held = list(loader)  # every batch of the epoch kept until the end
        times = torch.cat([t for _, t in held]).numpy()  # row r has timestamp r
        assert sorted(times.tolist()) == list(range(5000))  # each row once
        for values, stamps in held:
            want = small_expected[stamps.numpy()].astype(np.float32)
            np.testing.assert_array_equal(values.numpy(), want)
        decoded = [int(p.read_text()) for p in tmp_path.glob(f"epoch{epoch}-worker*")]
        assert len(decoded) == 2
        # each epoch decodes every row once between the two workers (streaming: again in
        # each epoch), where each decoded all of them before
        assert sum(decoded) == 5000 * GROUPS, decoded
    del loader, held
    assert _shm() <= before  # anonymous shared memory: no /dev/shm entry


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
def test_a_later_loader_with_more_workers_shares_blocks_too(
    tmp_path, small_dir, small_expected, decode_counting
):
    ds = decode_counting(small_dir, tmp_path, batch_size=700, shuffle=True, block_rows=1024)
    want = np.sort(small_expected[:, 0].astype(np.float32))
    for workers in (2, 3):  # the second loader needs an exchange for three workers
        loader = make_loader(ds, num_workers=workers, multiprocessing_context="fork")
        ds.set_epoch(workers)
        got = torch.cat(list(loader)).numpy()
        np.testing.assert_array_equal(np.sort(got[:, 0]), want)
        decoded = [int(p.read_text()) for p in tmp_path.glob(f"epoch{workers}-worker*")]
        assert len(decoded) == workers and sum(decoded) == 5000 * GROUPS, decoded
        del loader


def test_two_loaders_over_one_dataset_take_slots_of_their_own(small_dir, small_expected):
    # few slots (40 of 32 KiB, for 30 blocks a pass): the four persistent workers of two
    # loaders, alive at once, each hold slots of their own and reuse only what no live
    # process holds
    ds = TsFileIterableDataset(
        small_dir, batch_size=700, shuffle=True, block_rows=1024, return_timestamps=True,
        cache_bytes=40 * 1024 * 32,
    )  # fmt: skip
    loaders = [make_loader(ds, num_workers=2, multiprocessing_context="fork") for _ in range(2)]
    for epoch in range(4):
        ds.set_epoch(epoch)
        held = list(loaders[epoch % 2])
        assert sorted(torch.cat([t for _, t in held]).tolist()) == list(range(5000))
        for values, stamps in held:
            want = small_expected[stamps.numpy()].astype(np.float32)
            np.testing.assert_array_equal(values.numpy(), want)


@pytest.fixture
def finalized_decodes(tmp_path, monkeypatch):
    """Rows of finalized blocks (ReadingCore.block) each process decodes: a function
    returning them per process, for what was read since the last call."""

    def counted(core, table, lo, hi, annotate=None):
        with open(tmp_path / f"decodes-{os.getpid()}", "a") as fh:
            fh.write(f"{hi - lo}\n")
        return finalized(core, table, lo, hi, annotate)

    finalized = core_module._finalized
    monkeypatch.setattr(core_module, "_finalized", counted)  # the fork workers' too

    def decodes() -> list[int]:
        paths = list(tmp_path.glob("decodes-*"))
        out = [sum(map(int, p.read_text().split())) for p in paths]
        for path in paths:
            path.unlink()
        return out

    return decodes


@pytest.mark.parametrize(
    "order",
    [
        {"shuffle": True},
        {"shuffle": True, "return_dict": True, "time_features": ["hour_of_day"]},
        {"order": "random", "num_samples": 300},
        {"order": "batches"},
    ],
)
def test_windows_through_workers_decode_each_block_once_and_are_exact(
    ragged_panel, finalized_decodes, order
):
    # each batch gathers windows from the three devices' blocks: without the exchange both
    # workers decode all three
    def windows():
        return TsFileWindowDataset(ragged_panel, 24, 8, stride=4, seed=3, **order)

    want = list(make_loader(windows(), batch_size=32))  # 0 workers: the reference
    finalized_decodes()
    got = list(make_loader(windows(), batch_size=32, num_workers=2, multiprocessing_context="fork"))
    # the same windows, each as often, every field bit for bit (in another order: 2 workers
    # deliver their runs in turn)
    assert _windows(got) == _windows(want)
    # each block once, by whichever worker claimed it first (the main process decodes none)
    decoded = finalized_decodes()
    assert 1 <= len(decoded) <= 2 and sum(decoded) == 900 + 400 + 650, decoded


def test_a_mixture_through_workers_decodes_each_block_once(ragged_panel, finalized_decodes):
    def mixture():
        parts = [
            TsFileWindowDataset(ragged_panel, 24, 8, stride=4, devices=devices)
            for devices in (["meters.s0"], ["meters.s1", "meters.s2"])
        ]
        return MixedWindows(parts, [1.0, 2.0], num_samples=400, seed=5)

    want = list(make_loader(mixture(), batch_size=32))
    finalized_decodes()
    got = list(make_loader(mixture(), batch_size=32, num_workers=2, multiprocessing_context="fork"))
    assert _windows(got) == _windows(want)
    decoded = finalized_decodes()
    assert 1 <= len(decoded) <= 2 and sum(decoded) == 900 + 400 + 650, decoded


def _windows(batches) -> list[bytes]:
    """Every window of ``batches`` (tuples or dicts) as the bytes of all its fields, sorted."""
    out = []
    for batch in batches:
        fields = [batch[k] for k in sorted(batch)] if isinstance(batch, dict) else list(batch)
        tensors = [f for f in fields if isinstance(f, torch.Tensor)]
        out += [b"".join(t[i].numpy().tobytes() for t in tensors) for i in range(len(tensors[0]))]
    return sorted(out)


def _published(ex, key, fill: float) -> Block:
    claim = ex.acquire(key, np.float64, 0)
    assert isinstance(claim, tuple)
    n = key[3] - key[2]
    return ex.publish(claim, Block(np.arange(n, dtype=np.int64), np.full((1, n), fill)))


def _in_child(action) -> int:
    """Fork a child that runs ``action`` and exits 0, or 1 if it raised."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            action()
            code = 0
        finally:
            os._exit(code)
    return pid


def _exit_code(pid: int) -> int:
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_a_block_published_by_another_worker_is_served_read_only_in_its_epoch_only():
    ex = BlockExchange.for_blocks(block_rows=100, max_fields=1, capacity=10_000, num_workers=2)
    key = (0, 0, 0, 100)

    def publish():
        assert ex.bind()
        _published(ex, key, 7.0)

    assert _exit_code(_in_child(publish)) == 0
    assert ex.bind()
    theirs = ex.acquire(key, np.float64, epoch=0)
    np.testing.assert_array_equal(theirs.values, np.full((1, 100), 7.0))
    np.testing.assert_array_equal(theirs.times, np.arange(100))
    assert not theirs.values.flags.writeable
    assert ex.held() == 1
    theirs.release()
    assert ex.held() == 0
    # the next epoch decodes again: the block is not served, its key is claimed anew
    assert isinstance(ex.acquire(key, np.float64, epoch=1), tuple)


def test_slots_are_reused_only_once_no_process_holds_them():
    ex = BlockExchange.for_blocks(100, max_fields=1, capacity=2 * 100 * 16, num_workers=1)
    assert ex.num_slots == 2 and ex.bind()
    held = [_published(ex, (0, k, 0, 100), float(k)) for k in range(2)]
    assert ex.acquire((0, 2, 0, 100), np.float64, 0) is None  # both held: decode it alone
    held[0].release()
    third = _published(ex, (0, 2, 0, 100), 2.0)
    assert float(third.values[0, 0]) == 2.0 and float(held[1].values[0, 0]) == 1.0
    assert ex.acquire((0, 0, 0, 100), np.float64, 0) is None  # its slot went to block 2, held


def test_a_claim_of_a_worker_that_died_is_claimed_again():
    ex = BlockExchange.for_blocks(block_rows=10, max_fields=1, capacity=10_000, num_workers=2)
    key = (0, 0, 0, 10)
    assert ex.bind()

    def claim_and_die():
        assert ex.bind()
        assert isinstance(ex.acquire(key, np.float64, 0), tuple)

    assert _exit_code(_in_child(claim_and_die)) == 0
    start = time.monotonic()
    assert isinstance(ex.wait(key, np.float64, 0), tuple)  # taken over at once, not after WAIT_S
    assert time.monotonic() - start < exchange_module.WAIT_S / 2


@pytest.mark.parametrize("holds", ["claim", "lock"])
def test_a_stopped_worker_is_waited_for_at_most_wait_s(monkeypatch, holds):
    monkeypatch.setattr(exchange_module, "WAIT_S", 0.5)
    ex = BlockExchange.for_blocks(block_rows=10, max_fields=1, capacity=10_000, num_workers=2)
    key = (0, 0, 0, 10)
    assert ex.bind()

    def claim_and_stop():
        assert ex.bind()
        if holds == "claim":
            assert isinstance(ex.acquire(key, np.float64, 0), tuple)
        else:
            ex._lock.acquire()
        os.kill(os.getpid(), signal.SIGSTOP)

    pid = _in_child(claim_and_stop)
    try:
        os.waitpid(pid, os.WUNTRACED)  # returns once the child stopped itself
        if holds == "claim":
            assert ex.acquire(key, np.float64, 0) is BUSY
        start = time.monotonic()
        assert ex.wait(key, np.float64, 0) is None  # decoded alone, no hang
        assert 0.4 < time.monotonic() - start < 5
        assert ex.broken == (holds == "lock")  # a stuck lock: this process stops using it
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_a_failed_decode_gives_its_claim_back():
    ex = BlockExchange.for_blocks(block_rows=10, max_fields=1, capacity=10_000, num_workers=2)
    key = (0, 0, 0, 10)
    assert ex.bind()
    ex.abandon(ex.acquire(key, np.float64, 0))
    assert isinstance(ex.acquire(key, np.float64, 0), tuple)  # the next try decodes it


def test_an_exchange_does_not_pickle():
    ex = BlockExchange.for_blocks(block_rows=10, max_fields=1, capacity=10_000, num_workers=2)
    with pytest.raises(TypeError, match="fork workers only"):
        pickle.dumps(ex)


def test_a_block_larger_than_a_slot_is_kept_by_its_decoder_alone():
    ex = BlockExchange.for_blocks(block_rows=10, max_fields=1, capacity=10_000, num_workers=2)
    assert ex.bind()
    claim = ex.acquire((0, 0, 0, 50), np.float64, 0)
    big = Block(np.arange(50, dtype=np.int64), np.zeros((3, 50)))
    assert ex.publish(claim, big) is big  # not shared; the claim is given back
    assert isinstance(ex.acquire((0, 0, 0, 50), np.float64, 0), tuple)


def test_holder_columns_of_processes_that_ended_are_taken_again():
    ex = BlockExchange.for_blocks(block_rows=10, max_fields=1, capacity=10_000, num_workers=1)
    key = (0, 0, 0, 10)

    def hold():
        assert ex.bind()  # fails once the 16 columns are all taken by live processes
        assert ex.acquire(key, np.float64, 0) is not None

    for _ in range(20):  # more processes than columns, one after another (new workers each epoch)
        assert _exit_code(_in_child(hold)) == 0
    assert ex.bind()

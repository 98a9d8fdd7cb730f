"""Later window epochs through 0 or 2 make_loader workers (tuple or dict items, any cache).

    python benchmarks/windows_workers.py PANEL_DIR CACHE WORKERS tuple|dict [CACHE_DIR]

``TsFileWindowDataset(PANEL_DIR, 96, 24, 24, shuffle=True, shuffle_blocks=16, cache=CACHE)``,
256 windows a batch, 5 epochs (the consumer sums each batch's past values); prints each epoch's
seconds and the median of the 4 after the first. Run 0 and 2 workers one after the other on the
same panel (``python benchmarks/windows.py`` writes one under the temporary directory).
"""

import statistics
import sys
import tempfile
import time

from tsfile_torch import TsFileWindowDataset, make_loader


def main() -> None:
    panel, cache, workers, items = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    cache_dir = sys.argv[5] if len(sys.argv) > 5 else tempfile.gettempdir() + "/tt-windows-cache"
    ds = TsFileWindowDataset(
        panel, 96, 24, 24, read_backend="auto", shuffle=True, shuffle_blocks=16, seed=0,
        cache=cache, cache_dir=cache_dir, return_dict=items == "dict",
    )  # fmt: skip
    loader = make_loader(ds, batch_size=256, num_workers=workers)
    seconds = []
    for _ in range(5):
        t = time.perf_counter()
        total = 0.0
        for batch in loader:
            x = batch["past_values"] if isinstance(batch, dict) else batch[0]
            total += float(x.sum())
        seconds.append(time.perf_counter() - t)
    later = statistics.median(seconds[1:])
    print(cache, workers, items, [f"{s:.3f}" for s in seconds], f"later median {later:.4f}")


if __name__ == "__main__":
    main()

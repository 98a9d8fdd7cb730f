"""Time window epochs of whatever tsfile_torch is imported (for A/B runs of two commits).

Builds ``TsFileWindowDataset(paths, 96, 24, 24)`` over the panel in ``DIR`` (``cache_bytes``
optional), iterates it through ``make_loader(batch_size=256)`` with 0 workers, and prints one JSON
line: build seconds, the first epoch, the median of 5 later epochs. Run it from outside a
checkout with ``PYTHONPATH`` naming the commit's tree (``python -c`` and a script's own directory
come ahead of ``PYTHONPATH``), alternating the two commits:

    cd /tmp && PYTHONPATH=<tree> python3 <checkout>/benchmarks/windows_ab.py DIR [CACHE_BYTES]
"""

import json
import os
import statistics
import sys
import time

from tsfile_torch import TsFileWindowDataset, make_loader


def main() -> None:
    directory = sys.argv[1]
    paths = sorted(
        os.path.join(directory, f) for f in os.listdir(directory) if f.endswith(".tsfile")
    )
    cache_bytes = int(sys.argv[2]) if len(sys.argv) > 2 else None
    t = time.perf_counter()
    ds = TsFileWindowDataset(paths, 96, 24, 24, read_backend="auto", cache_bytes=cache_bytes)
    build = time.perf_counter() - t
    loader = make_loader(ds, batch_size=256)

    def epoch() -> float:
        t = time.perf_counter()
        total = 0.0
        for x, _ in loader:
            total += float(x[0, 0, 0])
        return time.perf_counter() - t

    first = epoch()
    later = statistics.median(epoch() for _ in range(5))
    print(json.dumps({"build": build, "first": first, "later": later}))


if __name__ == "__main__":
    main()

"""Where a stepped streaming epoch goes: decodes by thread and backend, time waiting for batches.

Reference workload through ``make_loader`` (0 workers), 7 epochs: the first without a consumer,
the rest with ``benchmarks/startup.py``'s training step (torch matrix products on one thread,
about 20 ms a batch). Per epoch: seconds, seconds waiting for batches, and the decodes counted
by (thread, backend of the reader they went through: "" = the dataset's own).

    cd /tmp && python <checkout>/benchmarks/stepped_probe.py auto|mmap|pread
"""

import collections
import sys
import threading
import time

import torch
from startup import training_step  # benchmarks/startup.py, beside this file

from tsfile_torch import TsFileIterableDataset, make_loader
from tsfile_torch.bench.reference import reference_data

torch.set_num_threads(1)


def main() -> None:
    backend = sys.argv[1] if len(sys.argv) > 1 else "auto"
    ds = TsFileIterableDataset(str(reference_data()), batch_size=8192, read_backend=backend)
    reader = ds.core.reader
    seen = []
    decode = reader.decoder.decode

    def recording(plan):
        seen.append((threading.current_thread().name.split("_")[0], plan.via))
        return decode(plan)

    reader.decoder.decode = recording
    loader = make_loader(ds)
    training_step(0.02)  # calibrated here, not inside the first stepped epoch
    for epoch in range(7):
        seen.clear()
        waited = 0.0
        start = asked = time.perf_counter()
        for _ in loader:
            waited += time.perf_counter() - asked
            if epoch:
                training_step(0.02)
            asked = time.perf_counter()
        took = time.perf_counter() - start
        counts = dict(collections.Counter(seen))
        print(f"epoch {epoch}: {took:.3f} s, waiting {waited:.3f} s, decodes {counts}")


if __name__ == "__main__":
    main()

"""Epoch-throughput benchmark; same as ``tsfile-torch bench`` (see ``--help``).

python benchmarks/epoch_throughput.py --quick
python benchmarks/epoch_throughput.py --json out.jsonl --plot out.png
"""

import sys

from tsfile_torch.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))

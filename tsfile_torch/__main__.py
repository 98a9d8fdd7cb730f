"""``python -m tsfile_torch``: the command line."""

import sys

from tsfile_torch.cli import main

if __name__ == "__main__":
    sys.exit(main())

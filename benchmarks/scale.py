"""Scale benchmark (same as ``tsfile-torch bench --scale``): rows, files, columns, decode floor."""

import sys

from tsfile_torch.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "--scale", *sys.argv[1:]]))

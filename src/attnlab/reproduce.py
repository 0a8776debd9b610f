"""`python -m attnlab.reproduce`: the command; the code is attnlab.study.reproduce (docs/reproducing.md)."""

import sys

from attnlab.study.reproduce.cli import main

if __name__ == "__main__":
    sys.exit(main())

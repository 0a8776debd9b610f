"""`python -m attnlab.compare`: the command; the code is attnlab.study.compare (docs/compare.md)."""

import sys

from attnlab.study.compare.cli import main

if __name__ == "__main__":
    sys.exit(main())

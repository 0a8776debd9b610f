"""`python -m attnlab.report`: the command; the code is attnlab.study.report (docs/compare.md)."""

import sys

from attnlab.study.report import main

if __name__ == "__main__":
    sys.exit(main())

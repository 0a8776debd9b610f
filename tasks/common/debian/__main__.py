"""Fetch and prepare the English Debian package descriptions (what `make data` runs).

    python -m tasks.common.debian --data-dir data/debian
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

from attnlab.errors import command, require_dir
from tasks.common.debian.records import corpus_stats, load_rows, prepare


@command
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tasks.common.debian",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default="data/debian", help="where to fetch and write (default data/debian)")
    parser.add_argument("--force", action="store_true", help="fetch and prepare again")
    args = parser.parse_args(argv)
    require_dir(args.data_dir, "--data-dir", "--data-dir data/debian", missing_ok=True)
    start = time.time()
    path = prepare(args.data_dir, force=args.force)
    stats = corpus_stats(load_rows(args.data_dir))
    print(f"[debian] {path}: {json.dumps(stats)} ({time.time() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m attnlab.docs` (`make docs`): regenerate the README's parts that the code decides.

Today one part: the model x task matrix between `<!-- matrix:begin -->` and `<!-- matrix:end -->`,
a row per registered scheme, a column per task card, each cell asked of the code that decides it
(`attnlab.runner.check_scheme_fits_task`, `AttentionSpec.for_decoder`). A new scheme or task
changes it; `make docs` rewrites it and `tests/e2e/test_docs.py` fails until it is current.

    python -m attnlab.docs            # rewrite README.md in place (says whether it changed)
    python -m attnlab.docs --check    # exit 1 if README.md is stale, writing nothing
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnlab.cards import CONF_DIR

README = CONF_DIR.parent / "README.md"
MATRIX_BEGIN, MATRIX_END = "<!-- matrix:begin -->", "<!-- matrix:end -->"


def cell(scheme: str, card) -> str:
    """Where `model=<scheme>` runs in the task: "refused" (the runner stops it: a scheme that
    normalizes over queries in a causal task, a causal-only scheme in a task whose scheme sits in
    attention that is not causal, the encoder of an encoder-decoder task included), "encoder"
    (the task's decoder stays UNAS) or "runs"."""
    from omegaconf import OmegaConf

    from attnlab.attention import AttentionSpec
    from attnlab.errors import ConfigError
    from attnlab.runner import check_scheme_fits_task

    cfg = OmegaConf.create({"model": {"name": scheme, "scheme": scheme},
                            "task": {"name": card.name, "causal": card.causal}})
    try:
        check_scheme_fits_task(cfg)
    except ConfigError:
        return "refused"
    spec = AttentionSpec.from_config(scheme)
    if card.encoder_layers is not None and spec.for_decoder() != spec:
        return "encoder"  # the task has a decoder, which stays UNAS
    return "runs"


def matrix(conf_dir: Path | None = None) -> str:
    """The README's model x task table: a row per registered scheme, a column per task card."""
    from attnlab.attention import names
    from attnlab.cards import task_cards

    cards = task_cards(conf_dir)
    lines = ["| `model=` | " + " | ".join(f"`task={t}`" for t in cards) + " |",
             "|---|" + "---|" * len(cards)]
    for scheme in names():
        cells = " | ".join(cell(scheme, card) for card in cards.values())
        lines.append(f"| `{scheme}` | {cells} |")
    return "\n".join(lines)


def between(text: str, begin: str, end: str) -> str:
    """The text between two markers, stripped."""
    return text[text.index(begin) + len(begin): text.index(end)].strip()


def render(text: str, conf_dir: Path | None = None) -> str:
    """`text` (the README) with the generated matrix between its markers."""
    if MATRIX_BEGIN not in text or MATRIX_END not in text:
        raise SystemExit(f"README.md lacks the markers {MATRIX_BEGIN} ... {MATRIX_END}")
    head, rest = text.split(MATRIX_BEGIN, 1)
    _, tail = rest.split(MATRIX_END, 1)
    return f"{head}{MATRIX_BEGIN}\n{matrix(conf_dir)}\n{MATRIX_END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnlab.docs", description=__doc__.splitlines()[0])
    parser.add_argument("--readme", type=Path, default=README, help="the README to update")
    parser.add_argument("--check", action="store_true", help="exit 1 if it is stale; write nothing")
    args = parser.parse_args(argv)
    try:
        text = args.readme.read_text()
    except OSError as err:  # a missing file or a folder: one line, not a traceback
        print(f"error: --readme {args.readme}: {err.strerror}; give the README, e.g. --readme README.md",
              file=sys.stderr)
        return 2
    if MATRIX_BEGIN not in text or MATRIX_END not in text:
        print(f"error: --readme {args.readme} lacks the markers {MATRIX_BEGIN} ... {MATRIX_END} the "
              f"matrix goes between; give the README, e.g. --readme README.md", file=sys.stderr)
        return 2
    new = render(text)
    if new == text:
        print(f"{args.readme}: the model x task matrix is current")
        return 0
    if args.check:
        print(f"{args.readme}: the model x task matrix is stale; run `make docs`")
        return 1
    from attnlab.files import atomic_write_text

    atomic_write_text(args.readme, new)
    print(f"{args.readme}: the model x task matrix regenerated")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m attnlab.docs` (`make docs`): regenerate the docs' parts that the code decides.

Its parts, each between its markers:
- README.md, `<!-- matrix:begin -->` ... `<!-- matrix:end -->`: the model x task matrix, a row per
  registered scheme, a column per task card, each cell asked of the code that decides it
  (`attnlab.runner.check_scheme_fits_task`, `AttentionSpec.for_decoder`);
- docs/attention.md, `<!-- routes:begin -->` ... `<!-- routes:end -->`: which kernel runs each
  registered scheme on the CPU, a column per kind of call, each cell `route(call)` of a call of
  that kind (tests/attention/test_routes.py checks that it is the kernel that runs);
- README.md and docs/results.md, `<!-- test-run:begin -->` ... `<!-- test-run:end -->`: the test
  suite's count and time, from `docs/test_run.json`, the last measurement: a whole passing
  `make test` writes `outputs/test_run.json` (tests/helpers/measured_run.py) and `make docs`
  copies it there first.
A new scheme or task changes them; `make docs` rewrites them and `tests/e2e/test_docs.py` fails
until they are current.

    python -m attnlab.docs            # rewrite them in place (says whether each changed)
    python -m attnlab.docs --check    # exit 1 if one is stale, writing nothing
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from attnlab.cards import CONF_DIR

README = CONF_DIR.parent / "README.md"
ATTENTION_DOC = CONF_DIR.parent / "docs" / "attention.md"
RESULTS_DOC = CONF_DIR.parent / "docs" / "results.md"
TEST_RUN_RECORD = CONF_DIR.parent / "docs" / "test_run.json"  # the last measurement, committed
MEASURED_RUN = CONF_DIR.parent / "outputs" / "test_run.json"  # what the last `make test` wrote
MATRIX_BEGIN, MATRIX_END = "<!-- matrix:begin -->", "<!-- matrix:end -->"
ROUTES_BEGIN, ROUTES_END = "<!-- routes:begin -->", "<!-- routes:end -->"
TEST_RUN_BEGIN, TEST_RUN_END = "<!-- test-run:begin -->", "<!-- test-run:end -->"
# the kinds of CPU call the routes table has a column for: (heading, padded, causal, dropout_p)
CALL_KINDS = (("plain", False, False, 0.0), ("padding", True, False, 0.0),
              ("causal", False, True, 0.0), ("causal, padding", True, True, 0.0),
              ("padding, dropout", True, False, 0.1), ("causal, dropout", False, True, 0.1))
ROUTE_LENGTH = 160  # above stick-breaking's one block (128 x 128 pairs), as task batches are


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


def route_call(scheme: str, padded: bool, causal: bool, dropout_p: float) -> tuple[tuple, dict]:
    """The arguments of `attend` for a CPU call of this kind (the routes table's, and the test's
    that runs it): (q, k, v, key_padding_mask, query_padding_mask, causal, dropout_p), inputs."""
    import torch

    from attnlab.attention.schemes import NORMALIZERS

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, ROUTE_LENGTH, 16, generator=g) for _ in range(3))
    mask = torch.zeros(2, ROUTE_LENGTH, dtype=torch.bool)
    mask[1, -3:] = True
    masks = (mask, mask) if padded else (None, None)
    inputs = {"u": 0.5} if "u" in NORMALIZERS[scheme].input_names else {}
    return (q, k, v, *masks, causal, dropout_p), inputs


def route_cell(scheme: str, padded: bool, causal: bool, dropout_p: float) -> str:
    """The kernel that runs `scheme` (its default options) on a CPU call of this kind: the
    name `route` gives, "refused" where the scheme does not take such a call, "materialized"
    for a transform or a head scheme (its logits or maps, then the normalization's reference)."""
    from attnlab.attention import AttentionSpec
    from attnlab.attention.functional import route
    from attnlab.attention.schemes import NORMALIZERS
    from attnlab.errors import ConfigError

    if scheme not in NORMALIZERS:
        refused = AttentionSpec.from_config(scheme).causal_only and not causal
        return "refused" if refused else structure_route(scheme, padded, causal, dropout_p)
    args, inputs = route_call(scheme, padded, causal, dropout_p)
    try:
        return route(*args[:3], scheme, *args[3:], **inputs)
    except ConfigError:
        return "refused"


def structure_route(scheme: str, padded: bool, causal: bool, dropout_p: float) -> str:
    """What a transform or head scheme runs on this kind of call (its default normalization):
    its own `route` where it has one (diff: the normalizer's fast path for each map; selective:
    "blocks"), else "materialized"."""
    from attnlab.attention import MultiHeadAttention
    from attnlab.attention.schemes import Heads

    (q, k, v, *masks, causal, dropout_p), _ = route_call("unas", padded, causal, dropout_p)
    b, h, s, d = q.shape
    module = MultiHeadAttention(h * d, h, spec=scheme)
    structure = module.head_scheme if module.head_scheme is not None else module.transform
    if not hasattr(structure, "route"):
        return "materialized"
    query = q.transpose(1, 2).reshape(b, s, h * d)  # the query input (diff v2 projects it)
    return structure.route(module.normalizer, Heads(q, k, v, *masks, causal, dropout_p, None, query))


def routes() -> str:
    """docs/attention.md's table: a row per registered scheme, a column per kind of CPU call."""
    from attnlab.attention import names

    lines = ["| scheme | " + " | ".join(kind[0] for kind in CALL_KINDS) + " |",
             "|---|" + "---|" * len(CALL_KINDS)]
    for scheme in names():
        cells = " | ".join(f"`{route_cell(scheme, *kind[1:])}`" for kind in CALL_KINDS)
        lines.append(f"| `{scheme}` | {cells} |")
    return "\n".join(lines)


def duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s"


def suite_figures(record_path: Path | None = None) -> str:
    """The sentence of the last measured `make test` (docs/test_run.json)."""
    record = json.loads((record_path or TEST_RUN_RECORD).read_text())
    return (f"**{duration(record['seconds'])}** for {record['tests']:,} tests ({record['passed']:,} "
            f"passed, {record['skipped']} skipped) on {record['cores']} cores ({record['cpu']}, load "
            f"{record['load_at_start']} at the start, Python {record['python']}, {record['date']}); "
            f"`make docs` writes this from the last whole passing `make test`, and a run whose "
            f"count differs fails until it is current.")


def between(text: str, begin: str, end: str) -> str:
    """The text between two markers, stripped."""
    return text[text.index(begin) + len(begin): text.index(end)].strip()


def render(text: str, conf_dir: Path | None = None) -> str:
    """`text` (the README) with the generated matrix between its markers."""
    return replaced(text, MATRIX_BEGIN, MATRIX_END, matrix(conf_dir))


def replaced(text: str, begin: str, end: str, content: str) -> str:
    """`text` with `content` between its markers `begin` and `end`."""
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{content}\n{end}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnlab.docs", description=__doc__.splitlines()[0])
    parser.add_argument("--readme", type=Path, default=README, help="the README to update")
    parser.add_argument("--attention-doc", type=Path, default=ATTENTION_DOC,
                        help="docs/attention.md, whose routes table to update")
    parser.add_argument("--results-doc", type=Path, default=RESULTS_DOC,
                        help="docs/results.md, whose test figures to update")
    parser.add_argument("--test-run", type=Path, default=TEST_RUN_RECORD,
                        help="the last measured test run the figures come from")
    parser.add_argument("--measured", type=Path, default=MEASURED_RUN,
                        help="what the last whole `make test` wrote; copied to --test-run first")
    parser.add_argument("--check", action="store_true", help="exit 1 if one is stale; write nothing")
    args = parser.parse_args(argv)
    if not args.check and args.measured.is_file() and (
            not args.test_run.is_file() or args.measured.read_text() != args.test_run.read_text()):
        from attnlab.files import atomic_write_text

        atomic_write_text(args.test_run, args.measured.read_text())
        print(f"{args.test_run}: the last measured test run, copied from {args.measured}")
    figures = lambda: suite_figures(args.test_run)  # read after the copy above
    parts = [(args.readme, "--readme", MATRIX_BEGIN, MATRIX_END, "the model x task matrix", matrix,
              "the README", "README.md"),
             (args.attention_doc, "--attention-doc", ROUTES_BEGIN, ROUTES_END, "the routes table",
              routes, "the attention page", "docs/attention.md"),
             (args.readme, "--readme", TEST_RUN_BEGIN, TEST_RUN_END, "the test figures", figures,
              "the README", "README.md"),
             (args.results_doc, "--results-doc", TEST_RUN_BEGIN, TEST_RUN_END, "the test figures",
              figures, "the results page", "docs/results.md")]
    status = 0
    for path, option, begin, end, what, generate, page, example in parts:
        try:
            text = path.read_text()
        except OSError as err:  # a missing file or a folder: one line, not a traceback
            print(f"error: {option} {path}: {err.strerror}; give {page}, e.g. {option} {example}",
                  file=sys.stderr)
            return 2
        if begin not in text or end not in text:
            print(f"error: {option} {path} lacks the markers {begin} ... {end} {what} goes "
                  f"between; give {page}, e.g. {option} {example}", file=sys.stderr)
            return 2
        try:
            new = replaced(text, begin, end, generate())
        except FileNotFoundError as err:  # no measured test run yet
            print(f"error: {err.filename} is missing: {what} come from it; run `make test` (a whole "
                  f"passing run writes {MEASURED_RUN}), then `make docs`", file=sys.stderr)
            return 2
        if new == text:
            print(f"{path}: {what} is current")
        elif args.check:
            print(f"{path}: {what} is stale; run `make docs`")
            status = 1
        else:
            from attnlab.files import atomic_write_text

            atomic_write_text(path, new)
            print(f"{path}: {what} regenerated")
    return status


if __name__ == "__main__":
    sys.exit(main())

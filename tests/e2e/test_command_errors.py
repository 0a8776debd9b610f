"""The `python -m attnlab.*` commands and the tasks' own (`python -m tasks.*`) refuse a name that
does not exist (a task, claim, probe, scheme, metric, folder or file) in one `error:` line with
exit code 2, never doing nothing with exit 0; docs/errors.md shows each line (`<dir>`: the test's
folder). train.py and eval.py: tests/e2e/test_cli_errors.py. Each command's `main(argv)` runs in
this process; the tasks' cases fail before any download."""

import importlib
import json

import pytest
from helpers.paths import ROOT

ERRORS_DOC = ROOT / "docs" / "errors.md"

# (module, arguments after `python -m <module>`, the error line's start); {tmp} is a folder with
# `empty/`, `sweep/` (one finished vqa job) and `afile.txt`
CASES = [
    ("attnlab.report", ["{tmp}/missing"],
     "error: {tmp}/missing is not a directory; pass outputs/multirun/<timestamp>"),
    ("attnlab.report", ["{tmp}/empty"], "error: no metrics.json under {tmp}/empty"),
    ("attnlab.report", ["{tmp}/sweep", "--metrics", "test/acx"],
     "error: --metrics test/acx: no job logged it (did you mean test/acc?); e.g. --metrics "),
    ("attnlab.report", ["{tmp}/sweep", "--metrics", "tset/*"], "error: --metrics tset/*: no job logged it"),
    ("attnlab.report", ["{tmp}/sweep", "--baseline", "model=dnas"],  # the sweep ran unas only
     "error: --baseline model=dnas: no row has these overrides"),
    ("attnlab.reproduce", ["--claims", "nope", "--dry-run"], "error: --claims nope: unknown ['nope']; choose from "),
    ("attnlab.reproduce", ["--tasks", "vqa,nope", "--dry-run"],
     "error: --tasks vqa,nope: unknown ['nope']; choose from classify, "),
    ("attnlab.compare", ["--probes", "nope", "--dry-run"], "error: --probes nope: unknown ['nope']; choose from "),
    ("attnlab.compare", ["--schemes", "nope", "--dry-run"], "error: --schemes nope: unknown ['nope']; choose from "),
    ("attnlab.compare", ["--stability", "--probes", "needle", "--dry-run"],
     "error: --stability trains task=lm over its own learning-rate grid"),
    ("attnlab.diagnose", ["{tmp}/missing"],
     "error: {tmp}/missing: neither a checkpoint file nor a transformers model directory"),
    ("attnlab.diagnose", ["{tmp}/afile.txt"],
     "error: ckpt_path={tmp}/afile.txt is not a readable checkpoint (truncated or corrupt"),
    ("attnlab.sync", ["{tmp}/missing"], "error: {tmp}/missing is not a directory"),
    ("attnlab.sync", ["{tmp}/empty"], "error: no offline W&B run (wandb/offline-run-*) under {tmp}/empty"),
    ("attnlab.dashboards", ["--entity", "me", "--tasks", "nope", "--spec-only", "{tmp}/spec.json"],
     "error: --tasks nope: unknown; choose from classify, "),
    ("attnlab.dashboards", ["--entity", "me", "--sweep-dir", "{tmp}/empty", "--spec-only", "{tmp}/spec.json"],
     "error: --sweep-dir {tmp}/empty: no finished job"),
    ("attnlab.docs", ["--readme", "{tmp}/missing.md", "--check"],
     "error: --readme {tmp}/missing.md: No such file or directory; give the README"),
    ("attnlab.docs", ["--readme", "{tmp}/empty", "--check"], "error: --readme {tmp}/empty: Is a directory"),
    ("tasks.headline.baseline", ["--pairs-dir", "{tmp}/missing"],
     "error: --pairs-dir {tmp}/missing is not a directory; pass the folder of the headline pairs"),
    ("tasks.headline.baseline", ["--pairs-dir", "{tmp}/empty"],
     "error: {tmp}/empty/test.jsonl does not exist; run the headline task"),
    ("tasks.classify.baselines", ["--source", "tsv"], "error: --source tsv needs --data-dir, the folder of its train, val and test files"),
    ("tasks.classify.baselines", ["--source", "tsv", "--data-dir", "{tmp}/missing"],
     "error: --data-dir={tmp}/missing does not exist; give an existing directory, e.g. --data-dir data/yelp"),
    ("tasks.classify.baselines", ["--source", "tsv", "--data-dir", "{tmp}/empty"],
     "error: no train file in {tmp}/empty: expected one named like train.tsv"),
    ("tasks.classify.baselines", ["--source", "tsv", "--data-dir", "{tmp}/empty", "--json", "{tmp}/missing/b.json"],
     "error: --json {tmp}/missing/b.json: the folder {tmp}/missing does not exist"),
    ("tasks.classify.baselines", ["--data-dir", "{tmp}/afile.txt"],  # debian: a file where it would fetch
     "error: --data-dir={tmp}/afile.txt is a file, not a directory"),
    ("tasks.classify.debian_sections", ["--data-dir", "{tmp}/afile.txt"],
     "error: --data-dir={tmp}/afile.txt is a file, not a directory"),
    ("tasks.common.debian", ["--data-dir", "{tmp}/afile.txt"],
     "error: --data-dir={tmp}/afile.txt is a file, not a directory"),
    ("tasks.mt.debian_pairs", ["--data-dir", "{tmp}/afile.txt"],
     "error: --data-dir={tmp}/afile.txt is a file, not a directory"),
    ("tasks.mt.debian_pairs", ["--data-dir", "{tmp}/afile.txt/data"],
     "error: --data-dir={tmp}/afile.txt/data: {tmp}/afile.txt is a file, not a directory"),
]


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "afile.txt").write_text("not a folder\n")
    job = tmp_path / "sweep" / "0_vqa_unas_seed1"
    job.mkdir(parents=True)
    (job / "metrics.json").write_text(json.dumps({
        "status": "ok", "task": "vqa", "model": "unas", "seed": 1, "optimized_metric": "val/acc",
        "overrides": ["model=unas", "task=vqa", "seed=1"], "metrics": {"test/acc": 0.5, "val/acc": 0.6}}))
    return tmp_path


def main_of(module: str):
    """The function `python -m <module>` runs (the thin entry modules forward to attnlab.study)."""
    entry = {"attnlab.report": "attnlab.study.report", "attnlab.compare": "attnlab.study.compare.cli",
             "attnlab.reproduce": "attnlab.study.reproduce.cli"}.get(module, module)
    try:
        return importlib.import_module(entry).main
    except AttributeError:  # a package: `python -m` runs its __main__.py
        return importlib.import_module(f"{entry}.__main__").main


@pytest.mark.parametrize("module, args, says", CASES, ids=[f"{m} {' '.join(a)}" for m, a, _ in CASES])
def test_an_unknown_name_is_one_error_line_and_exit_2(module, args, says, folder, capsys):
    def fill(text: str) -> str:
        return text.replace("{tmp}", str(folder))

    assert main_of(module)([fill(a) for a in args]) == 2
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(fill(says)), err
    # docs/errors.md shows the command and the line
    shown = lines[0].replace(str(folder), "<dir>")
    command = " ".join(["python -m", module, *(a.replace("{tmp}", "<dir>") for a in args)])
    assert f"| `{command}` | {shown} |" in ERRORS_DOC.read_text(), (command, shown)


def commands() -> dict[str, str]:
    """{`python -m` name: source} of every command: attnlab's top-level modules with a __main__
    block and every task module with one (a package's __main__.py is the package's command)."""
    found = {f"attnlab.{p.stem}": p.read_text() for p in (ROOT / "src" / "attnlab").glob("*.py")}
    for path in (ROOT / "tasks").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__main__" else parts)] = path.read_text()
    return {name: text for name, text in found.items() if 'if __name__ == "__main__"' in text}


def test_every_command_has_a_case():
    """Every `python -m attnlab.<name>` and `python -m tasks.<...>` is tried above, and hands its
    main's exit code to the shell (a bare `main()` would exit 0 after an error line)."""
    found = commands()
    assert set(found) == {m for m, _, _ in CASES}
    for name, text in found.items():
        assert text.count('if __name__ == "__main__":') == 1, name
        assert 'if __name__ == "__main__":\n    sys.exit(main())\n' in text, name

"""The `python -m attnlab.*` commands refuse a name that does not exist (a task, claim, probe,
scheme, metric, folder or file) in one `error:` line with exit code 2, never doing nothing with
exit 0; docs/errors.md shows each line (`<dir>`: the test's folder). train.py and eval.py:
tests/e2e/test_cli_errors.py. Each command's `main(argv)` runs in this process."""

import importlib
import json

import pytest
from helpers.paths import ROOT

ERRORS_DOC = ROOT / "docs" / "errors.md"

# (module, arguments after `python -m <module>`, the error line's start); {tmp} is a folder with
# `empty/` and `sweep/` (one finished vqa job)
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
    ("attnlab.sync", ["{tmp}/missing"], "error: {tmp}/missing is not a directory"),
    ("attnlab.sync", ["{tmp}/empty"], "error: no offline W&B run (wandb/offline-run-*) under {tmp}/empty"),
    ("attnlab.dashboards", ["--entity", "me", "--tasks", "nope", "--spec-only", "{tmp}/spec.json"],
     "error: --tasks nope: unknown; choose from classify, "),
    ("attnlab.dashboards", ["--entity", "me", "--sweep-dir", "{tmp}/empty", "--spec-only", "{tmp}/spec.json"],
     "error: --sweep-dir {tmp}/empty: no finished job"),
    ("attnlab.docs", ["--readme", "{tmp}/missing.md", "--check"],
     "error: --readme {tmp}/missing.md: No such file or directory; give the README"),
    ("attnlab.docs", ["--readme", "{tmp}/empty", "--check"], "error: --readme {tmp}/empty: Is a directory"),
]


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "empty").mkdir()
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
    return importlib.import_module(entry).main


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


def test_every_command_has_a_case():
    """Every `python -m attnlab.<name>` (a module with a __main__ block) is tried above."""
    commands = {f"attnlab.{p.stem}" for p in (ROOT / "src" / "attnlab").glob("*.py")
                if 'if __name__ == "__main__"' in p.read_text()}
    assert commands == {m for m, _, _ in CASES}

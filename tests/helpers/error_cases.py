"""Bad inputs and faults, with what the user sees: the test data of e2e/test_cli_errors.py and
e2e/test_faults.py, and the source of the tables of docs/errors.md.

    PYTHONPATH=tests python -m helpers.error_cases     # from the repository root: run every case
                                                       # and rewrite those tables

(From the root, so that `tasks` is this checkout's package and not the folder tests/tasks/.)

A case's `args` are what the user types after `python train.py` (or eval.py); `{tmp}` is a folder
that `make_files` fills with bad files. The test asserts exit code 2, one `error:` line that
contains `names` (the key or the file), no traceback, and the docs/errors.md row with that very
line.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from helpers.paths import ROOT

# the page that shows every case and fault (between the markers)
ERRORS_DOC = ROOT / "docs" / "errors.md"
BEGIN, END = "<!-- error-table:begin -->", "<!-- error-table:end -->"


@dataclass(frozen=True)
class Case:
    what: str
    args: tuple[str, ...]
    names: str  # the error line must contain it ({tmp} substituted)
    script: str = "train.py"
    cpu_only: bool = False  # an error only where there is no CUDA GPU


CASES: list[Case] = [
    # --- the command line and the config groups
    Case("an option that does not exist", ("model=nope",), "model=nope"),
    Case("a task that does not exist", ("task=nope",), "task=nope"),
    Case("a probe that does not exist", ("task=probe", "probe=nope"), "probe=nope"),
    Case("a mistyped Trainer argument", ("trainer.max_step=40",), "trainer.max_step=40"),
    Case("a mistyped task option", ("task.module.optimizer.lrr=0.1",), "task.module.optimizer.lrr=0.1"),
    Case("a mistyped callback argument", ("callbacks.scheme_parameters.every_n_step=5",),
         "callbacks.scheme_parameters.every_n_step"),
    Case("a mistyped logger argument", ("logger=csv", "logger.csv.flush_every=5"), "logger.csv.flush_every"),
    Case("an argument the class does not take, added with +", ("+task.module.net.foo=1",), "task.module.net.foo"),
    Case("an override that does not parse", ("trainer.max_steps=[",), "trainer.max_steps=["),
    Case("an unset environment variable in the config", ("task.data_dir=${oc.env:ATTNLAB_NOT_SET}",),
         "ATTNLAB_NOT_SET"),
    # --- types and ranges: Trainer (the schema, or Lightning's own checks)
    Case("a word for a number", ("trainer.max_steps=abc",), "trainer.max_steps=abc"),
    Case("a fraction for a whole number", ("trainer.max_epochs=1.5",), "trainer.max_epochs=1.5"),
    Case("a batch limit out of range (Lightning's check)", ("trainer.limit_train_batches=1.5",),
         "limit_train_batches"),
    Case("zero gradient accumulation", ("trainer.accumulate_grad_batches=0",),
         "trainer.accumulate_grad_batches=0"),
    Case("an unknown precision", ("trainer.precision=banana",), "trainer.precision=banana"),
    Case("negative gradient clipping", ("trainer.gradient_clip_val=-1",), "trainer.gradient_clip_val=-1"),
    Case("a word for the validation interval", ("trainer.val_check_interval=abc",),
         "trainer.val_check_interval=abc"),
    Case("an unknown strategy (Lightning's ValueError)", ("trainer.strategy=nope",), "trainer.strategy=nope"),
    # --- types and ranges: task and data
    Case("batch size 0", ("task.datamodule.batch_size=0",), "task.datamodule.batch_size=0"),
    Case("a word for the batch size", ("task.datamodule.batch_size=abc",), "task.datamodule.batch_size=abc"),
    Case("a negative learning rate", ("task.module.optimizer.lr=-1",), "task.module.optimizer.lr=-1"),
    Case("dropout above 1", ("task.module.net.dropout=1.5",), "task.module.net.dropout=1.5"),
    Case("split fractions that do not sum to 1", ("task=mlm", "task.data.fractions=[0.5,0.6,0.2]"),
         "task.data.fractions"),
    Case("a sequence length of 0", ("task=mlm", "task.data.max_length=0"), "task.data.max_length=0"),
    Case("a width the heads do not divide", ("task=mlm", "task.module.net.d_model=30", "task.module.net.nhead=4"),
         "task.module.net.d_model=30"),
    # a task's own options: the ranges its classes declare (option_rules), not the library's table
    Case("no boxes per view (VQA)", ("task.max_boxes=0",), "task.max_boxes=0"),
    Case("zero glimpses (VQA)", ("task.module.net.glimpses=0",), "task.module.net.glimpses=0"),
    Case("a masking rate of 1 (MLM)", ("task=mlm", "task.data.mask_rate=1"), "task.data.mask_rate=1"),
    Case("a beam of 0 (headline, mt)", ("task=headline", "task.module.beam_size=0"), "task.module.beam_size=0"),
    Case("an unknown monitor mode", ("task.monitor_mode=maximum",), "task.monitor_mode=maximum"),
    Case("a word for the seed", ("seed=abc",), "seed=abc"),
    Case("a negative seed", ("seed=-1",), "seed=-1"),
    Case("a seed beyond 32 bits", ("seed=99999999999",), "seed=99999999999"),
    Case("a word for trust_checkpoint", ("trust_checkpoint=maybe",), "trust_checkpoint=maybe"),
    Case("an unknown compile setting", ("compile=banana",), "compile=banana"),
    Case("an unknown data source (raised inside instantiation)", ("task.source=bogus",), "task.source"),
    Case("a generator option out of range (raised inside instantiation)",
         ("task.synthetic.annotator_noise=2",), "task.synthetic"),
    # --- the model group: the attention scheme checks its own options
    Case("HNAS u outside [0, 1]", ("model=hnas", "model.hybrid_init=2"), "model.hybrid_init=2"),
    Case("Sinkhorn with 0 iterations", ("model=sinkhorn", "model.n_iter=0"), "model.n_iter=0"),
    # --- files that are not what they claim
    Case("a checkpoint that does not exist", ("ckpt_path={tmp}/missing.ckpt",), "{tmp}/missing.ckpt"),
    Case("a directory as checkpoint", ("ckpt_path={tmp}/adir",), "{tmp}/adir"),
    Case("a corrupt checkpoint", ("ckpt_path={tmp}/corrupt.ckpt",), "{tmp}/corrupt.ckpt"),
    Case("a truncated checkpoint", ("ckpt_path={tmp}/truncated.ckpt",), "{tmp}/truncated.ckpt"),
    Case("a checkpoint of another task and model", ("ckpt_path={tmp}/mlm_run/checkpoints/last.ckpt",),
         "task=mlm"),
    Case("a checkpoint of another model, moved out of its run dir", ("ckpt_path={tmp}/stray.ckpt",),
         "{tmp}/stray.ckpt"),
    Case("ckpt_path=last with nothing to resume", ("ckpt_path=last", "model=dnas"), "no last.ckpt"),
    Case("a checkpoint that would run code when loaded (a pickle payload)", ("ckpt_path={tmp}/payload.ckpt",),
         "trust_checkpoint=true"),
    Case("a directory as text file", ("task=mlm", "task.data.files=[{tmp}/adir]"), "{tmp}/adir"),
    Case("a text file that does not exist", ("task=mlm", "task.data.files=[{tmp}/missing.txt]"),
         "{tmp}/missing.txt"),
    Case("a file as data directory", ("task=headline", "task.source=gigaword",
                                      "task.gigaword_dir={tmp}/afile.txt"), "{tmp}/afile.txt"),
    Case("a directory as VQA-v2 questions file", ("task.source=vqav2", "task.vqav2.train.questions={tmp}/adir"),
         "{tmp}/adir"),
    Case("train.py with an unknown quantization scheme for its final test", ("quant=w3a3x",),
         "quant=w3a3x: unknown; choose one of none, w8a8, w4a8, w4a16"),
    # --- eval.py
    Case("eval.py without a checkpoint", (), "ckpt_path", script="eval.py"),
    Case("eval.py with a corrupt checkpoint", ("ckpt_path={tmp}/corrupt.ckpt",), "{tmp}/corrupt.ckpt",
         script="eval.py"),
    Case("eval.py with a checkpoint that does not exist", ("ckpt_path={tmp}/missing.ckpt",), "{tmp}/missing.ckpt",
         script="eval.py"),
    Case("eval.py on an unknown split", ("ckpt_path={tmp}/corrupt.ckpt", "split=train"), "split=train",
         script="eval.py"),
    Case("eval.py with an unknown quantization scheme", ("ckpt_path={tmp}/corrupt.ckpt", "quant=w3a3x"),
         "quant=w3a3x: unknown; choose one of none, w8a8, w4a8, w4a16", script="eval.py"),
    Case("eval.py with a checkpoint that would run code when loaded", ("ckpt_path={tmp}/payload.ckpt",),
         "trust_checkpoint=true", script="eval.py"),
    Case("eval.py with a foreign _target_ in the run's config.yaml",
         ("ckpt_path={tmp}/foreign_run/checkpoints/last.ckpt",), "task.module._target_=torch.load",
         script="eval.py"),
    # --- the machine
    Case("hardware=gpu without a CUDA GPU", ("hardware=gpu",), "hardware=gpu", cpu_only=True),
    Case("hardware=ddp without a CUDA GPU", ("hardware=ddp",), "hardware=ddp", cpu_only=True),
    Case("hardware=fsdp without a CUDA GPU", ("hardware=fsdp",), "hardware=fsdp", cpu_only=True),
]

# Faults survived: what goes wrong, what happens, and the test that shows it.
FAULTS: list[tuple[str, str, str]] = [
    ("a logger fails (disk full, a dead service)",
     ("one warning `[attnlab] logger X failed in ...; training goes on without it`; the other "
      "loggers, metrics.json and checkpoints are written"),
     "test_faults.py::test_a_failing_logger_warns_once_and_the_run_goes_on"),
    ("the W&B dir cannot be created or written",
     "W&B writes the run under the system temp dir instead; the summary and metrics.json say where",
     "test_faults.py::test_a_failing_logger_warns_once_and_the_run_goes_on"),
    ("a sweep job fails",
     ("the other jobs run; `attnlab.study.report` lists it under the table as `failed`, with the error"),
     "test_faults.py::test_a_failed_sweep_job_does_not_stop_the_others"),
    ("a sweep job is killed (kill -9, out of memory)",
     ("`attnlab.study.report` lists it as `killed` (its metrics.json still says `running`, or there is "
      "none); with a process per job (`hydra/launcher=submitit_local`, `submitit_slurm`) the other "
      "jobs run on, with the default launcher the sweep's one process is gone"),
     "test_faults.py::test_a_killed_sweep_job_does_not_stop_the_others (slow)"),
    ("`kill -9` in the middle of an epoch, or at an epoch end",
     ("`ckpt_path=last` resumes from the last checkpoint (within epochs: every "
      "`callbacks.last_checkpoint.every_n_train_steps`, default 100) and reaches the same final "
      "metrics as an uninterrupted run (CPU)"),
     "test_faults.py::test_kill_9_then_resume_reaches_the_same_metrics"),
    ("a kill while a checkpoint is written",
     "the previous checkpoint stays whole and loadable (written to `.<name>.partial`, then renamed)",
     "test_faults.py::test_a_kill_during_a_save_leaves_the_previous_checkpoint"),
    ("SIGTERM / Ctrl-C (preemption)",
     "`checkpoints/last.ckpt` is written, exit code 143 (SIGTERM) or 130 (Ctrl-C); `ckpt_path=last` resumes",
     "test_cli.py::test_sigterm_writes_a_checkpoint_that_resumes"),
    ("the disk is full or read-only when a checkpoint is written",
     ("one line `error: <the file>: No space left on device; free space there, or write the run "
      "elsewhere: paths.output_dir=<a folder with room> (every run: paths.log_dir=...)` (read-only: "
      "`...; write the run elsewhere: ...`), exit 2; the previous checkpoint stays whole"),
     "test_cli_errors.py::test_a_full_or_read_only_disk_is_one_line"),
    ("a truncated data cache (the VQA `.npz`, Debian `records.jsonl`; the MLM token cache alike)",
     "`rebuilding the cache because ...`, then the run goes on",
     "test_faults.py::test_truncated_caches_are_rebuilt"),
]


class Payload:
    """What a crafted checkpoint holds: unpickling it runs a shell command, here one that leaves a
    file (`ran_code`) that the tests look for."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def make_files(tmp: Path) -> None:
    """The bad files the cases point at."""
    (tmp / "adir").mkdir(parents=True, exist_ok=True)
    (tmp / "afile.txt").write_text("a file, not a folder\n")
    (tmp / "corrupt.ckpt").write_bytes(b"this is not a checkpoint\n" * 40)
    state = {"state_dict": {"foo.weight": torch.zeros(64, 64)}, "epoch": 0, "global_step": 10,
             "hyper_parameters": {"attention": {"name": "unas", "scheme": "unas"}}}
    torch.save(state, tmp / "stray.ckpt")
    whole = (tmp / "stray.ckpt").read_bytes()
    (tmp / "truncated.ckpt").write_bytes(whole[: len(whole) // 2])
    run = tmp / "mlm_run"
    (run / "checkpoints").mkdir(parents=True, exist_ok=True)
    torch.save(state, run / "checkpoints" / "last.ckpt")
    (run / "config.yaml").write_text("task:\n  name: mlm\nmodel:\n  name: hnas\n")
    torch.save({**state, "hyper_parameters": Payload(tmp / "ran_code")}, tmp / "payload.ckpt")
    # a clean checkpoint whose run config would load the payload with weights_only=False
    foreign = tmp / "foreign_run"
    (foreign / "checkpoints").mkdir(parents=True, exist_ok=True)
    torch.save(state, foreign / "checkpoints" / "last.ckpt")
    (foreign / "config.yaml").write_text(
        f"task:\n  name: mlm\n  module:\n    _target_: torch.load\n    f: {tmp / 'payload.ckpt'}\n"
        f"    weights_only: false\nmodel:\n  name: unas\n")


def arguments(case: Case, tmp: Path, quiet: list[str], tiny: dict[str, list[str]]) -> list[str]:
    """The case's arguments, plus the test's quiet and tiny settings where the case sets nothing
    (a case that got past validation by mistake then trains a tiny model, not the default one)."""
    args = [a.replace("{tmp}", str(tmp)) for a in case.args]
    if case.script != "train.py":
        return args
    task = next((a.split("=", 1)[1] for a in args if a.startswith("task=")), "vqa")
    keys = {a.split("=", 1)[0].lstrip("+") for a in args}
    extra = [a for a in [*quiet, *tiny.get(task, [])] if a.split("=", 1)[0] not in keys]
    return [*args, *extra]


def run_case(case: Case, tmp: Path, env: dict, run_app, quiet, tiny):
    return run_app(arguments(case, tmp, quiet, tiny), env, script=case.script)


def command(case: Case) -> str:
    return " ".join(["python", case.script, *case.args]).replace("{tmp}", "<dir>")


def shown(line: str, tmp: Path) -> str:
    """An error line as docs/errors.md shows it: the temp folder as <dir>, pipes escaped, and
    the list of `model=` choices as `<every conf/model/*.yaml>` (so that a new scheme, its file
    and YAML, leaves this page as it is)."""
    line = re.sub(r"choose one of coda, [a-z0-9_, ]+, e\.g\. model=", "choose one of <every "
                  "conf/model/*.yaml>, e.g. model=", line)
    return line.replace(str(tmp), "<dir>").replace("|", "\\|")


def table(rows: dict[Case, str]) -> str:
    lines = ["| what goes wrong | command | what you see |", "|---|---|---|"]
    for case, line in rows.items():
        lines.append(f"| {case.what} | `{command(case)}` | {line} |")
    lines += ["", "| fault | what happens | tested by |", "|---|---|---|"]
    lines += [f"| {what} | {behaviour} | `tests/e2e/{test}` |" for what, behaviour, test in FAULTS]
    return "\n".join(lines)


def doc_row(case: Case, line: str) -> str:
    return f"| {case.what} | `{command(case)}` | {line} |"


def write_doc(rows: dict[Case, str]) -> None:
    text = ERRORS_DOC.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    ERRORS_DOC.write_text(text[:start] + "\n" + table(rows) + "\n" + text[end:])


def main() -> int:
    from helpers.cards import TINY
    from helpers.cli import QUIET, run_app

    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        make_files(tmp)
        env = {"ATTNLAB_OUTPUTS": str(tmp / "outputs"), "ATTNLAB_DATA": str(tmp / "data"),
               "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
        rows = {}
        for case in CASES:
            result = run_case(case, tmp, env, run_app, QUIET, TINY)
            errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
            rows[case] = shown(errors[0] if errors else f"(exit {result.code}, no error line)", tmp)
            print(f"{result.code} {case.what}: {rows[case]}")
    write_doc(rows)
    print(f"wrote {len(rows)} cases and {len(FAULTS)} faults into {ERRORS_DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

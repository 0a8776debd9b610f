"""Shared helpers for tests that run the real CLI (train.py / eval.py) as a subprocess."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"

# Command-line overrides that shrink each task to seconds (tiny data, tiny model, one epoch).
TINY: dict[str, list[str]] = {
    "vqa": [
        "task.synthetic.n_train_images=48", "task.synthetic.n_val_images=16", "task.synthetic.n_test_images=16",
        "task.synthetic.questions_per_image=4", "task.datamodule.batch_size=32", "task.datamodule.eval_batch_size=64",
        "task.module.hidden_dim=32", "task.module.embed_dim=16", "task.module.attention_dim=16",
        "trainer.max_epochs=1",
    ],
    "mlm": [
        f"task.data.files=[{FIXTURES / 'text' / 'paragraphs.txt'}]", "task.data.fractions=[0.6,0.2,0.2]",
        "task.data.max_length=48", "task.datamodule.batch_size=8", "task.module.d_model=32",
        "task.module.num_layers=2", "task.module.nhead=2", "task.module.dim_feedforward=64",
        "trainer.max_epochs=1", "trainer.limit_train_batches=2",
    ],
    "headline": [
        "task.source=gigaword", f"task.gigaword_dir={FIXTURES / 'headline' / 'gigaword'}",
        "task.datamodule.max_source_length=32", "task.datamodule.max_target_length=12",
        "task.datamodule.batch_size=2", "task.datamodule.eval_batch_size=2", "task.module.d_model=16",
        "task.module.nhead=2", "task.module.num_encoder_layers=1", "task.module.num_decoder_layers=1",
        "task.module.dim_feedforward=32", "task.module.val_decode_batches=1", "task.module.max_decode_length=6",
        "task.module.beam_size=2", "trainer.max_epochs=1",
    ],
    "classify": [
        "task.source=tsv", f"task.data_dir={FIXTURES / 'classify' / 'reviews'}", "task.data.tokenizer=word",
        "task.data.min_frequency=1", "task.data.max_length=16", "task.datamodule.batch_size=8",
        "task.module.embed_dim=16", "task.module.hidden_dim=8", "task.module.d_model=16", "task.module.nhead=2",
        "task.module.num_layers=2", "task.module.dim_feedforward=32", "task.module.hops=3",
        "task.module.attention_unit=8", "task.module.fc_dim=16", "trainer.max_epochs=1",
    ],
    "mt": [
        "task.source=files", f"task.data_dir={FIXTURES / 'mt' / 'iwslt14'}", "task.vocab_size=300",
        "task.bleu_tokenize=none", "task.datamodule.min_frequency=1", "task.datamodule.batch_size=4",
        "task.datamodule.eval_batch_size=2", "task.datamodule.max_test_examples=null", "task.module.d_model=16",
        "task.module.nhead=2", "task.module.num_encoder_layers=2", "task.module.num_decoder_layers=2",
        "task.module.dim_feedforward=32", "task.module.val_decode_batches=1", "task.module.max_len_a=0",
        "task.module.max_len_b=6", "task.module.beam_size=2", "trainer.max_epochs=1", "trainer.val_check_interval=1.0",
    ],
    "lm": [
        "task.source=wikitext", f"task.data_dir={FIXTURES / 'lm' / 'wikitext'}", "task.data.block_size=16",
        "task.eval_stride=8", "task.datamodule.batch_size=4", "task.module.d_model=16", "task.module.nhead=2",
        "task.module.num_layers=2", "task.module.dim_feedforward=32", "task.module.adaptive_cutoffs=[8,30]",
        "task.module.prompt_length=4", "task.module.sample_length=6", "trainer.max_epochs=1",
    ],
}
# fast, quiet defaults for every CLI test run
QUIET = ["logger=csv", "callbacks.progress_bar=null", "trainer.enable_model_summary=false"]


def cli_env(tmp_path: Path, data_dir: Path) -> dict:
    env = dict(os.environ)
    env.update(
        ATTNLAB_OUTPUTS=str(tmp_path / "outputs"),
        ATTNLAB_DATA=str(data_dir),
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "2"),
    )
    env.pop("WANDB_API_KEY", None)
    return env


def run_cli(args: list[str], tmp_path: Path, data_dir: Path, script: str = "train.py",
            timeout: float = 600, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, str(ROOT / script), *args], cwd=tmp_path,
        env={**cli_env(tmp_path, data_dir), **(env or {})},
        capture_output=True, text=True, timeout=timeout, check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{script} {' '.join(args)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}"
            f"\n--- stderr\n{proc.stderr[-6000:]}"
        )
    return proc


def metrics_files(outputs: Path) -> list[dict]:
    return [json.loads(p.read_text()) | {"_dir": p.parent} for p in sorted(outputs.rglob("metrics.json"))]


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """One data dir per test session, so generated datasets are cached across CLI runs."""
    return tmp_path_factory.mktemp("data")


# ----------------------------------------------------------------------------- in-process CLI
@dataclass
class AppResult:
    code: int
    stdout: str
    stderr: str


def _load_script(script: str):
    """train.py / eval.py as a module (its `main` is the @hydra.main function), loaded once."""
    name = f"attnlab_cli_{Path(script).stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / script)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        # Hydra finds conf/ next to the file of a task function that lives in __main__
        module.main.__wrapped__.__module__ = "__main__"
    return sys.modules[name]


def run_app(args: list[str], env: dict[str, str], script: str = "train.py") -> AppResult:
    """The CLI entry (attnlab.cli.run around the script's Hydra app) in this process: what the
    shell would see (exit code, stdout, stderr) without paying ~10 s of imports per call."""
    from attnlab import cli

    app = _load_script(script)
    out, err = io.StringIO(), io.StringIO()
    saved_argv, saved_env = sys.argv, dict(os.environ)
    sys.argv = [str(ROOT / script), *args]
    os.environ.update(env)
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            cli.run(app.main, ROOT / "conf")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except Exception:  # noqa: BLE001 - what Python does with an uncaught exception
        err.write(traceback.format_exc())
        code = 1
    finally:
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)
    return AppResult(code, out.getvalue(), err.getvalue())
@pytest.fixture
def one_thread():
    """Torch on one thread: tiny tensors run faster so, above all when the cores are shared."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

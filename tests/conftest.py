"""Shared helpers for tests that run the real CLI (train.py / eval.py) as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
            timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, str(ROOT / script), *args], cwd=tmp_path, env=cli_env(tmp_path, data_dir),
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

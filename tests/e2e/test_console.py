"""A clean console: a tiny `python train.py` run with the default loggers and callbacks (W&B
offline, a mid-epoch checkpoint every step), started from another working directory, prints the
progress, the summary and the results, and none of the known-harmless messages that
attnlab.console drops or whose cause was fixed (weights_only on every checkpoint save)."""

import subprocess
import sys

from helpers.cards import TINY
from helpers.cli import cli_env
from helpers.paths import ROOT

# what a `make train` printed between the model summary and the results before
NOISE = {
    "weights_only": "`weights_only` was not set, defaulting to `False`.",  # our checkpoint saves
    "lightning tip": "💡 Tip:",  # Lightning's advertisements of litlogger / litmodels
    "wandb anonymous": "The anonymous setting has no effect",  # Lightning passes anonymous=None
    "pytree": "isinstance(treespec, LeafSpec)",  # torch deprecates what Lightning's pytree uses
}


def test_a_tiny_run_prints_no_known_harmless_warning(tmp_path, data_dir):
    env = cli_env(tmp_path, data_dir)
    env.pop("WANDB_SILENT", None)  # as a researcher's shell: attnlab sets it itself
    args = ["model=hnas", "task=vqa", *TINY["vqa"], "callbacks.last_checkpoint.every_n_train_steps=1"]
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    found = {name: text for name, text in NOISE.items() if text in out}
    assert not found, f"{found} in:\n{out[-5000:]}"
    for wanted in ("Total params", "test/acc", "run dir:", "hnas_u"):  # the summary and results
        assert wanted in out, (wanted, out[-3000:])

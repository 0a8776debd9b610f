"""`eval.py ckpt_path=... quant=<scheme>` through the real CLI (in this process): quant=none is
today's eval, a scheme records the quantized metrics beside the full-precision ones and the drop."""

import json

import pytest
import yaml
from helpers.cards import TINY
from helpers.cli import QUIET, metrics_files, run_cli, run_here


def evaluated(tmp_path, data_dir, ckpt, *args, process: bool = False) -> dict:
    """eval.py's record and stdout; `process`: in a process of its own (the quantized evals build
    three trainers each; their progress bars then never outlive a redirected stdout here)."""
    for old in (tmp_path / "outputs").rglob("eval_metrics.json"):
        old.unlink()
    run = run_cli if process else run_here
    result = run([f"ckpt_path={ckpt}", QUIET[0], *args], tmp_path, data_dir, script="eval.py")
    [path] = list((tmp_path / "outputs").rglob("eval_metrics.json"))
    return json.loads(path.read_text()) | {"_stdout": result.stdout}


def test_quantized_eval_of_a_trained_lm(tmp_path, data_dir):
    run_here(["task=lm", "model=unas", *TINY["lm"], *QUIET, "callbacks=minimal"], tmp_path, data_dir)
    [run] = metrics_files(tmp_path / "outputs")
    best = next((run["_dir"] / "checkpoints").glob("best-*.ckpt"))
    layers = yaml.safe_load((run["_dir"] / "config.yaml").read_text())["task"]["module"]["net"]["num_layers"]
    plain = evaluated(tmp_path, data_dir, best)
    none = evaluated(tmp_path, data_dir, best, "quant=none")
    assert none["metrics"] == plain["metrics"] and "quant" not in none  # bit-identical, nothing added
    assert "full precision" not in plain["_stdout"]
    w8a8 = evaluated(tmp_path, data_dir, best, "quant=w8a8", "quant_options.calibration_batches=2",
                     process=True)
    assert w8a8["full_precision"] == plain["metrics"]
    assert w8a8["quant"] == {"scheme": "w8a8", "per_channel": False, "calibration_batches": 2,
                             "layers": 6 * layers}  # q, k, v, out, and the two feed-forward linears
    loss = "test/loss"
    assert w8a8["metrics"][loss] != plain["metrics"][loss]
    assert w8a8["drop"][loss] == pytest.approx(plain["metrics"][loss] - w8a8["metrics"][loss])
    w4 = evaluated(tmp_path, data_dir, best, "quant=w4a16", "quant_options.per_channel=true", process=True)
    assert w4["quant"]["calibration_batches"] == 0 and w4["quant"]["per_channel"] is True
    # 4-bit weights cost more than 8-bit ones (both from the same weights)
    assert abs(w4["drop"][loss]) > abs(w8a8["drop"][loss])
    assert "full precision" in w4["_stdout"] and "value (w4a16)" in w4["_stdout"]

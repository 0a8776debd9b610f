"""`eval.py ckpt_path=... quant=<scheme>` through the real CLI (real processes): quant=none is
today's eval, a scheme records the quantized metrics beside the full-precision ones and the drop;
`train.py quant=<scheme>` does the same after its own test."""

import json

import pytest
import yaml
from helpers.cards import TINY
from helpers.cli import QUIET, metrics_files, run_cli


def evaluated(tmp_path, data_dir, ckpt, *args) -> dict:
    """eval.py's record and stdout, in a process of its own: in this process, an eval run after
    others left the xdist worker's captured stdout closed in a fresh-clone CI run (cause not
    found), and every later test of that worker failed."""
    for old in (tmp_path / "outputs").rglob("eval_metrics.json"):
        old.unlink()
    result = run_cli([f"ckpt_path={ckpt}", QUIET[0], *args], tmp_path, data_dir, script="eval.py")
    [path] = list((tmp_path / "outputs").rglob("eval_metrics.json"))
    return json.loads(path.read_text()) | {"_stdout": result.stdout}


def test_quantized_eval_of_a_trained_lm(tmp_path, data_dir):
    # train.py's quant=: the final test again, quantized, beside the full-precision numbers
    run_cli(["task=lm", "model=unas", *TINY["lm"], *QUIET, "callbacks=minimal", "quant=w8a8",
             "quant_options.calibration_batches=2"], tmp_path, data_dir)
    [run] = metrics_files(tmp_path / "outputs")
    trained = run["metrics"]
    assert trained["test/loss@w8a8/drop"] == pytest.approx(trained["test/loss"] - trained["test/loss@w8a8"])
    assert trained["test/loss@w8a8"] != trained["test/loss"]
    assert (run["_dir"] / "quant-w8a8" / "predictions.txt").is_file()  # its files beside, not over, the run's
    best = next((run["_dir"] / "checkpoints").glob("best-*.ckpt"))
    layers = yaml.safe_load((run["_dir"] / "config.yaml").read_text())["task"]["module"]["net"]["num_layers"]
    none = evaluated(tmp_path, data_dir, best, "quant=none")
    assert none["metrics"]["test/loss"] == trained["test/loss"]  # the run's test was of its best weights
    assert "quant" not in none and "full precision" not in none["_stdout"]  # today's eval
    w8a8 = evaluated(tmp_path, data_dir, best, "quant=w8a8", "quant_options.calibration_batches=2")
    assert w8a8["full_precision"] == none["metrics"]  # bit for bit: quant=none is the same scoring
    assert w8a8["quant"] == {"scheme": "w8a8", "per_channel": False, "calibration_batches": 2,
                             "layers": 6 * layers}  # q, k, v, out, and the two feed-forward linears
    loss = "test/loss"
    assert w8a8["metrics"][loss] != none["metrics"][loss]
    assert w8a8["drop"][loss] == pytest.approx(none["metrics"][loss] - w8a8["metrics"][loss])
    w4 = evaluated(tmp_path, data_dir, best, "quant=w4a16", "quant_options.per_channel=true")
    assert w4["quant"]["calibration_batches"] == 0 and w4["quant"]["per_channel"] is True
    # 4-bit weights cost more than 8-bit ones (both from the same weights)
    assert abs(w4["drop"][loss]) > abs(w8a8["drop"][loss])
    assert "full precision" in w4["_stdout"] and "value (w4a16)" in w4["_stdout"]

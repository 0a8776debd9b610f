"""model=coda and model=repulsive through the real CLI in every task (fast_dev_run, tiny data; the
CLI entry in this process: helpers.cli.run_here)."""

import json

import pytest
import torch
from helpers.cards import CARDS, MULTI_HEAD, TINY, shares
from helpers.cli import QUIET, metrics_files, run_here

MODELS = ["coda", "repulsive"]
# both in the first task of each kind, in turn in the others; the rest `slow` (helpers.cards.shares)
CASES = [pytest.param(task, models, id=task + suffix, marks=marks)
         for task, (share, rest) in shares(MODELS).items()
         for models, suffix, marks in ((share, "", ()), (rest, "-rest", pytest.mark.slow)) if models]


@pytest.mark.parametrize(("task", "models"), CASES)
def test_coda_and_repulsive_run_in_every_task(task, models, tmp_path, data_dir):
    proc = run_here(["-m", f"task={task}", f"model={','.join(models)}", "debug=fast", *TINY[task],
                     *MULTI_HEAD[task], *QUIET], tmp_path, data_dir)
    records = {r["model"]: r for r in metrics_files(tmp_path / "outputs" / "multirun")}
    assert sorted(records) == sorted(models)
    for r in records.values():
        assert r["status"] == "ok", r.get("error")
        m = r["metrics"]
        assert any(k.startswith("test/") for k in m), m
        # head analyses ran on the model's multi-head attention
        assert {"val/avg_jsd", "val/head_distance", "test/avg_jsd", "test/head_distance"} <= set(m), m
        assert "head_importance/max_drop" in m
        assert (r["_dir"] / "head_jsd.png").is_file() and (r["_dir"] / "head_importance.csv").is_file()
        if CARDS[task].classification:  # class logits (mt, lm: next tokens): calibration
            assert {"val/ece", "test/oe"} <= set(m) and (r["_dir"] / "reliability_test.png").is_file()
        if task == "classify":  # the hops' diversity and their attention over one sentence per class
            assert {"val/dist", "test/dist", "test/hop_jsd"} <= set(m) and (r["_dir"] / "hop_attention.png").is_file()
        if task == "mt":
            assert (r["_dir"] / "predictions.tsv").is_file() and "test/bleu" in m
        if task == "lm":  # samples at the end of test (CODA's cascade decoded row by row)
            assert "greedy: " in (r["_dir"] / "predictions.txt").read_text()
    assert ("repulsive attention (svgd)" in proc.stdout) == ("repulsive" in models)


def test_eval_reloads_a_coda_checkpoint(tmp_path, data_dir):
    """eval.py (the module from the run's config, then the weights) rebuilds the cascade (head MLPs
    from layer 2 on) and reproduces the run's test metric."""
    run_here(["task=mlm", "model=coda", *TINY["mlm"], *QUIET, "~callbacks.head_importance"], tmp_path, data_dir)
    [run] = metrics_files(tmp_path / "outputs")
    best = next((run["_dir"] / "checkpoints").glob("best-*.ckpt"))
    state = torch.load(best, map_location="cpu", weights_only=True)["state_dict"]
    assert any(".transform.mixer." in k for k in state) and not any("layers.0.self_attn.transform.mixer" in k for k in state)
    run_here([f"ckpt_path={best}", QUIET[0]], tmp_path, data_dir, script="eval.py")
    [evaluated] = [json.loads(p.read_text()) for p in (tmp_path / "outputs").rglob("eval_metrics.json")]
    assert evaluated["metrics"]["test/acc"] == pytest.approx(run["metrics"]["test/acc"], abs=1e-6)

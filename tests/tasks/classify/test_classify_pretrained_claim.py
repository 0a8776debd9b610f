"""classify's claim "explaining away in a pretrained Transformer" (tasks.classify.pretrained_claim)
without training runs: the pretrained model is measured on the fixture descriptions, every layer
and head goes into the CSV, and the fine-tuning runs that were not trained say why."""

from __future__ import annotations

import csv
from functools import partial

import pytest
from helpers.paths import FIXTURES, ROOT

from attnlab.study.evidence import CONTRADICTED, HOLDS, NOT_TESTED
from attnlab.study.reproduce.plan import Plan
from attnlab.study.reproduce.results import Results
from tasks.classify import pretrained_claim
from tasks.classify.pretrained_stats import texts_as_batches
from tasks.common.debian import read_translation_file

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")


def test_runs_fine_tune_unas_and_hnas_on_the_pretrained_encoder():
    plan = Plan("quick", ROOT)
    runs = pretrained_claim.runs(plan)
    assert [r.model for r in runs] == ["unas", "hnas"]
    assert all(r.task == "classify" and "task.encoder=pretrained" in r.extra for r in runs)
    assert "++trainer.limit_train_batches=20" in runs[0].extra
    assert "++trainer.limit_train_batches=20" not in pretrained_claim.runs(Plan("full", ROOT))[0].extra


def test_evaluate_measures_the_pretrained_model_and_says_what_was_not_run(tmp_path, monkeypatch):
    texts = [" ".join([r.synopsis, *r.paragraphs])
             for r in read_translation_file(FIXTURES / "text" / "Translation-en")]
    monkeypatch.setattr(pretrained_claim, "real_texts", lambda root: texts)
    # the fixture descriptions are short: 24-token inputs instead of 128
    monkeypatch.setattr(pretrained_claim, "texts_as_batches", partial(texts_as_batches, length=24))
    monkeypatch.setitem(pretrained_claim.TEXTS, "quick", 3)
    plan = Plan("quick", ROOT)
    results = Results()
    result = pretrained_claim.evaluate(plan, results, tmp_path)
    # measured; the fixture texts leave no key below 1e-8 (the premise absent) or the fine-tuning
    # runs are missing: not tested either way, and why
    assert result.verdict == NOT_TESTED and result.reason
    assert "fine-tuned UNAS: not run" in result.ours and "--tasks" in result.ours
    with open(tmp_path / "pretrained_explaining_away.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 6 * 12 and {r["model"] for r in rows} == {"pretrained (softmax)"}
    assert all(int(r["keys"]) == 3 * 24 for r in rows)
    assert all(float(r["min_col_sum_x_S"]) > 0 for r in rows)
    assert (tmp_path / result.figures[0]).is_file()
    assert result.details.count("| pretrained (softmax) |") == 6

    # a fine-tuning run that failed is named with its error
    plan = Plan("quick", ROOT, tasks=("classify",))
    results.add(plan.run("classify", "unas", 1, pretrained_claim._extra(plan)),
                {"status": "failed", "error": "boom"})
    result = pretrained_claim.evaluate(plan, results, tmp_path)
    assert "fine-tuned UNAS: boom" in result.ours and "fine-tuned HNAS: not run" in result.ours


@pytest.mark.parametrize("premise, tuned, fewer, verdict", [
    (False, True, True, NOT_TESTED), (True, False, False, NOT_TESTED), (True, True, True, HOLDS),
    (True, True, False, CONTRADICTED)])
def test_verdict(premise, tuned, fewer, verdict):
    got, why = pretrained_claim.judge(premise, tuned, fewer)
    assert got == verdict and (bool(why) == (verdict == NOT_TESTED))
    if not premise:
        assert "mechanism not engaged" in why

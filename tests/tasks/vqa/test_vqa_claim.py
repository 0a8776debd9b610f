"""VQA's own reproduce claim (tasks/vqa/claim.py, named by the task's card): its column sums at
the start come from the task's generator as a run configured it, and without runs it says why."""

import pytest
from helpers.paths import CONF, ROOT
from omegaconf import OmegaConf

from attnlab.study import stats
from attnlab.study.evidence import CONTRADICTED, HOLDS, NOT_TESTED
from attnlab.study.reproduce.plan import Plan
from attnlab.study.reproduce.registry import claims
from attnlab.study.reproduce.results import Results
from tasks.vqa import claim


def test_the_card_names_the_claim():
    assert claims(CONF)[claim.NAME] is claim
    assert {r.task for r in claim.runs(Plan("quick", ROOT))} == {"vqa"}


def test_initial_column_sums_of_a_run_and_not_run_without_one(tmp_path):
    synthetic = {"seed": 0, "n_train_images": 4, "n_val_images": 2, "n_test_images": 3,
                 "questions_per_image": 2}
    config = {"task": {"synthetic": synthetic, "max_boxes": 100, "data_dir": str(tmp_path / "data"),
                       "datamodule": {"box_coords": True}}}
    OmegaConf.save(OmegaConf.create(config), tmp_path / "config.yaml")
    sums = claim.initial_column_sums({"run_dir": str(tmp_path)}, n_images=3)
    assert set(sums) == {"unas", "dnas"}
    for per_kind in sums.values():
        assert set(per_kind) == set(claim.BOX_KINDS) and sum(len(v) for v in per_kind.values()) > 0
        assert all((v > 0).all() for v in per_kind.values())
    result = claim.evaluate(Plan("quick", ROOT, tasks=("mlm",)), Results(), tmp_path)
    assert result.verdict == NOT_TESTED and "not selected with --tasks" in result.reason


def contrasts(dnas: list[float], hnas: list[float], unas: list[float]) -> dict:
    return stats.contrast_family({"DNAS": (dnas, unas, claim.MARGIN), "HNAS": (hnas, unas, claim.MARGIN)})


UNAS = [0.50, 0.52, 0.49, 0.51]


@pytest.mark.parametrize("engaged, verdict, reason", [
    ({"mirror": contrasts([0.60, 0.63, 0.61, 0.62], [0.50, 0.52, 0.50, 0.51], UNAS)}, HOLDS, ""),
    ({"mirror": contrasts([0.40, 0.42, 0.39, 0.41], [0.50, 0.52, 0.49, 0.51], UNAS)}, CONTRADICTED, ""),
    ({"mirror": contrasts([0.7, 0.4, 0.6, 0.3], [0.6, 0.5, 0.4, 0.6], UNAS)}, NOT_TESTED, "underpowered"),
    ({"mirror": contrasts([0.6], [0.6], [0.5])}, NOT_TESTED, "underpowered"),  # one seed: no test
    ({}, NOT_TESTED, "mechanism not engaged"),
])
def test_verdict_from_the_benchmarks_where_unas_explains_boxes_away(engaged, verdict, reason):
    got, why = claim.judge(engaged)
    assert got == verdict and reason in why

"""VQA's own reproduce claim (tasks/vqa/claim.py, named by the task's card): its column sums at
the start come from the task's generator as a run configured it, and without runs it says why."""

from helpers.paths import CONF, ROOT
from omegaconf import OmegaConf

from attnlab.reproduce.plan import Plan
from attnlab.reproduce.registry import claims
from attnlab.reproduce.results import NOT_RUN, Results
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
    assert result.verdict == NOT_RUN and "not selected with --tasks" in result.ours

"""VQA data: the VQA-v2 / MMF reader on fixture files, its errors, and the synthetic generator."""

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab.errors import DataError
from tasks.vqa import synthetic
from tasks.vqa.datamodule import VQADataModule, build_answer_vocab
from tasks.vqa.vqav2 import MMFFeatures, read_split

FIXTURES = Path(__file__).parent / "fixtures" / "vqa"
VIEWS = ["view_a", "view_b", "view_c"]
TINY = {
    "n_train_images": 12,
    "n_val_images": 4,
    "n_test_images": 4,
    "questions_per_image": 3,
    "max_boxes": 24,
    "min_boxes": 20,
    "feature_dim": 32,
    "max_objects": 6,
}


def vqav2_config(root: Path) -> dict:
    def split(name):
        return {
            "questions": str(root / f"v2_OpenEnded_mscoco_{name}2014_questions.json"),
            "annotations": str(root / f"v2_mscoco_{name}2014_annotations.json"),
            "feature_dirs": [str(root / "features" / v) for v in VIEWS],
            "name_pattern": f"COCO_{name}2014_{{image_id:012d}}",
        }

    return {"train": split("train"), "val": split("val"), "test": None}


@pytest.fixture
def fixture_copy(tmp_path):
    root = tmp_path / "vqa"
    shutil.copytree(FIXTURES, root)
    return root


# --- VQA-v2 reader ---------------------------------------------------------------------------


def test_read_split_joins_questions_and_annotations():
    cfg = vqav2_config(FIXTURES)["train"]
    records = read_split(cfg["questions"], cfg["annotations"])
    assert [r.question_id for r in records] == [90001, 90002, 250001, 250002, 300001]
    first = records[0]
    assert first.image_id == 9 and first.question == "How many dogs are there?"
    assert first.answers == ["2"] * 7 + ["two", "3", "2"]
    assert [r.answer_type for r in records] == ["number", "yes/no", "other", "yes/no", "other"]


def test_mmf_features_pad_truncate_and_normalize_boxes():
    cfg = vqav2_config(FIXTURES)["train"]
    files = MMFFeatures(cfg["feature_dirs"], cfg["name_pattern"], max_boxes=100)
    features, boxes, num_boxes = files.load(9)
    assert features.shape == (3, 100, 8) and boxes.shape == (3, 100, 4)
    raw_a = np.load(FIXTURES / "features/view_a/COCO_train2014_000000000009.npy")
    info_a = np.load(
        FIXTURES / "features/view_a/COCO_train2014_000000000009_info.npy", allow_pickle=True
    ).item()
    n_a = len(raw_a)
    # view_b has 120 boxes: truncated to 100; view_a has a few: zero-padded
    assert num_boxes.tolist() == [
        n_a,
        100,
        len(np.load(cfg["feature_dirs"][2] + "/COCO_train2014_000000000009.npy")),
    ]
    np.testing.assert_allclose(features[0, :n_a], raw_a)
    assert not features[0, n_a:].any() and not boxes[0, n_a:].any()
    scale = np.array([info_a["image_width"], info_a["image_height"]] * 2, np.float32)
    np.testing.assert_allclose(boxes[0, :n_a], info_a["bbox"] / scale, rtol=1e-6)
    assert files.feature_dim == 8


def test_datamodule_on_vqav2_fixtures():
    dm = VQADataModule(
        data_dir="unused",
        source="vqav2",
        vqav2=vqav2_config(FIXTURES),
        batch_size=2,
        answer_vocab_size=4,
    )
    dm.prepare_data()
    dm.setup("fit")
    kwargs = dm.model_kwargs()
    assert kwargs["num_views"] == 3 and kwargs["feature_dim"] == 8 + 4  # + box coordinates
    assert kwargs["num_answers"] == 4 and kwargs["question_types"] == ["yes/no", "number", "other"]
    # top-4 normalized train answers over all 10 annotators: no (10), yes (10), 2 (9: "two"
    # normalized), umbrella (9: "an umbrella" normalized); ties by text; red (8) is left out
    assert dm.answers == ["no", "yes", "2", "umbrella"]
    batch = next(iter(dm.train_dataloader()))
    assert batch["features"].shape == (2, 3, 100, 12)
    assert batch["box_mask"].dtype == torch.bool and batch["box_mask"].shape == (2, 3, 100)
    assert len(dm.datasets["test"]) == 2  # test falls back to the val files
    # question 90001: eight annotators say 2 ("two" normalized), so answer "2" scores 1
    first = dm.datasets["train"][0]
    assert first["scores"][dm.answers.index("2")].item() == pytest.approx(1.0)


def test_answer_vocab_counts_normalized_answers():
    assert build_answer_vocab([["Two", "2", "a cat"], ["cat", "3", "3", "3"]], size=2) == ["3", "2"]
    # ties broken by text; an answer that normalizes to "" (an article alone) is dropped
    assert build_answer_vocab([["y", "y", "x", "the"], ["x", "z"]], size=5) == ["x", "y", "z"]


def test_missing_feature_file_is_a_data_error_naming_it(fixture_copy):
    missing = fixture_copy / "features/view_c/COCO_train2014_000000000025_info.npy"
    missing.unlink()
    dm = VQADataModule(data_dir="unused", source="vqav2", vqav2=vqav2_config(fixture_copy))
    with pytest.raises(DataError, match="COCO_train2014_000000000025_info.npy"):
        dm.setup("fit")


@pytest.mark.parametrize(
    "name", ["COCO_train2014_000000000009.npy", "COCO_train2014_000000000009_info.npy"]
)
def test_corrupt_feature_file_is_a_data_error_naming_it(fixture_copy, name):
    path = fixture_copy / "features/view_b" / name
    path.write_bytes(b"\x93NUMPY garbage, not an array")
    cfg = vqav2_config(fixture_copy)["train"]
    files = MMFFeatures(cfg["feature_dirs"], cfg["name_pattern"])
    with pytest.raises(DataError, match=f"corrupt feature file .*{name}"):
        files.load(9)


def test_missing_or_corrupt_json_is_a_data_error(fixture_copy):
    cfg = vqav2_config(fixture_copy)
    Path(cfg["train"]["annotations"]).write_text('{"annotations": [')
    with pytest.raises(DataError, match="v2_mscoco_train2014_annotations.json"):
        read_split(cfg["train"]["questions"], cfg["train"]["annotations"])
    Path(cfg["val"]["questions"]).unlink()
    dm = VQADataModule(data_dir="unused", source="vqav2", vqav2=cfg)
    with pytest.raises(DataError, match="val questions file not found"):
        dm.prepare_data()


# --- synthetic generator ---------------------------------------------------------------------


def test_generator_is_deterministic_by_seed():
    a = synthetic.generate(synthetic.SyntheticParams(seed=3, **TINY))
    b = synthetic.generate(synthetic.SyntheticParams(seed=3, **TINY))
    c = synthetic.generate(synthetic.SyntheticParams(seed=4, **TINY))
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    assert not np.array_equal(a["train_features"], c["train_features"])
    assert a["train_question"].tolist() != c["train_question"].tolist()


def test_generator_views_and_questions_are_well_formed():
    params = synthetic.SyntheticParams(seed=0, **TINY)
    data = synthetic.generate(params)
    features, num_boxes = data["train_features"], data["train_num_boxes"]
    assert features.shape == (12, 3, 24, 32)
    assert ((num_boxes >= 20) & (num_boxes <= 24)).all()
    for i in range(12):  # padding slots are zero
        for v in range(3):
            assert not features[i, v, num_boxes[i, v] :].any()
    assert data["train_answers"].shape == (36, 10)
    assert set(data["train_question_type"]) <= set(synthetic.QUESTION_TYPES)
    assert data["train_image"].max() == 11


def test_primary_view_misses_objects_a_secondary_view_sees():
    params = synthetic.SyntheticParams(seed=0, **TINY)
    objects = synthetic._objects(np.random.default_rng(0), params, n_images=200)
    seen = objects["seen"]
    assert seen.any(axis=1).all()  # every object is seen by some view
    assert 0.3 < (~seen[:, 0]).mean() < 0.5  # the primary view misses ~40%
    assert seen[~seen[:, 0], 1:].any(axis=1).all()


def test_cache_is_written_once_atomically(tmp_path):
    params = synthetic.SyntheticParams(seed=1, **TINY)
    path = synthetic.prepare(tmp_path, params)
    assert path.parent.name == f"synthetic-{params.digest()}"
    stamp = path.stat().st_mtime_ns
    assert synthetic.prepare(tmp_path, params) == path and path.stat().st_mtime_ns == stamp
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".")] == []  # no temp left
    loaded = synthetic.load(path)
    np.testing.assert_array_equal(
        loaded["val_features"], synthetic.generate(params)["val_features"]
    )
    other = synthetic.SyntheticParams(seed=2, **TINY)
    assert synthetic.cache_path(tmp_path, other) != path
    path.write_bytes(b"broken")
    with pytest.raises(DataError, match="delete that directory"):
        synthetic.load(path)

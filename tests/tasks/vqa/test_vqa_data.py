"""VQA data: the VQA-v2 / MMF reader on fixture files, its errors, and the synthetic generator."""

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.paths import FIXTURES as FIXTURE_ROOT

from attnlab.errors import ConfigError, DataError
from tasks.vqa import synthetic, synthetic_questions, synthetic_scenes
from tasks.vqa.datamodule import VQADataModule, build_answer_vocab
from tasks.vqa.vqav2 import MMFFeatures, read_split

FIXTURES = FIXTURE_ROOT / "vqa"
VIEWS = ["view_a", "view_b", "view_c"]
TINY = {
    "n_train_images": 12,
    "n_val_images": 4,
    "n_test_images": 4,
    "questions_per_image": 3,
    "max_boxes": 24,
    "feature_dim": 40,
    "max_objects": 6,
    # what these tests ran with before SyntheticParams' defaults became conf/task/vqa.yaml's
    "annotator_noise": 0.15,
}
# big enough for statistics, generated once per module (about a second)
MEDIUM = {"n_train_images": 600, "n_val_images": 200, "n_test_images": 200, "annotator_noise": 0.15}


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
        synthetic=None,
        vqav2=vqav2_config(FIXTURES),
        batch_size=2,
        eval_batch_size=None,
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
    dm = VQADataModule(data_dir="unused", source="vqav2", synthetic=None,
                       vqav2=vqav2_config(fixture_copy), eval_batch_size=None)
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
    dm = VQADataModule(data_dir="unused", source="vqav2", synthetic=None, vqav2=cfg,
                       eval_batch_size=None)
    with pytest.raises(DataError, match="task.vqav2.val.questions=.* does not exist"):
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
    assert features.shape == (12, 3, 24, 40)
    assert ((num_boxes >= 1) & (num_boxes <= 24)).all()
    for i in range(12):  # padding slots are zero and show no object
        for v in range(3):
            assert not features[i, v, num_boxes[i, v] :].any()
            assert (data["train_box_object"][i, v, num_boxes[i, v] :] == -1).all()
    n_questions = len(data["train_question"])
    assert 0.8 * 36 <= n_questions <= 36  # balancing may drop a few
    assert data["train_answers"].shape == (n_questions, 10)
    assert data["train_hidden"].shape == (n_questions,)
    assert set(data["train_question_type"]) == set(synthetic_questions.QUESTION_TYPES)
    assert data["train_image"].max() == 11


@pytest.fixture(scope="module")
def medium():
    params = synthetic.SyntheticParams(seed=0, **MEDIUM)
    return params, synthetic.generate(params)


def test_primary_view_misses_objects_only_a_secondary_view_shows(medium):
    _params, data = medium
    seen = data["train_object_seen"]
    assert seen.any(axis=1).all()  # every object is seen by some view
    assert 0.33 < (~seen[:, 0]).mean() < 0.47  # the primary view misses ~40% (recall 0.6)
    # the boxes agree with `seen`: a view shows exactly the objects it detects
    box_object, image_of = data["train_box_object"], data["train_object_image"]
    first = np.searchsorted(image_of, np.arange(len(box_object)))
    for v in range(3):
        shown = np.zeros(len(seen), bool)
        i, n = np.nonzero(box_object[:, v] >= 0)
        shown[first[i] + box_object[i, v, n]] = True
        np.testing.assert_array_equal(shown, seen[:, v])
    kinds = synthetic.box_kinds(data, "train")
    hidden = kinds == synthetic.BOX_KINDS.index("hidden")
    assert not hidden[:, 0].any()  # the primary view never shows a primary-missed object
    assert hidden[:, 1:].sum() > 0.2 * (box_object[:, 1:] >= 0).sum()
    assert ((kinds == synthetic.BOX_KINDS.index("background")) == (box_object == -1) & (kinds >= 0)).all()
    padding = np.arange(box_object.shape[-1]) >= data["train_num_boxes"][..., None]
    np.testing.assert_array_equal(kinds == -1, padding)


def test_missed_objects_have_no_primary_box_nearby(medium):
    """What lets a fusion explain their boxes away: a primary-seen object's secondary boxes have a
    primary box on top of them, a primary-missed object's boxes only by chance (background)."""
    _, data = medium
    center = data["train_bbox"].astype(np.float32)
    center = (center[..., :2] + center[..., 2:]) / 2  # (I, V, N, 2)
    hidden = synthetic.box_kinds(data, "train") == synthetic.BOX_KINDS.index("hidden")
    objects = data["train_box_object"] >= 0
    distances = {"hidden": [], "visible": []}
    for i in range(len(center)):
        primary = center[i, 0, : data["train_num_boxes"][i, 0]]
        for v in (1, 2):
            for n in np.flatnonzero(objects[i, v]):
                d = np.linalg.norm(primary - center[i, v, n], axis=1).min()
                distances["hidden" if hidden[i, v, n] else "visible"].append(d)
    visible, missed = np.array(distances["visible"]), np.array(distances["hidden"])
    assert np.median(visible) < 0.03 and (visible < 0.1).mean() > 0.97
    assert np.median(missed) > 0.08 and (missed > 0.05).mean() > 0.7


def test_questions_are_balanced_per_question_string(medium):
    """No question string gives its yes/no answer away: per string, the two answers differ by at
    most `balance_slack` (CLEVR-style rejection sampling)."""
    params, data = medium
    for split in ("train", "val"):
        tallies = {}
        for question, answer, qtype in zip(
            data[f"{split}_question"], data[f"{split}_answer"], data[f"{split}_question_type"]
        ):
            if qtype in ("existence", "comparison"):
                tallies.setdefault(question, {"yes": 0, "no": 0})[answer] += 1
        assert len(tallies) > 50
        for question, tally in tallies.items():
            assert abs(tally["yes"] - tally["no"]) <= params.balance_slack, (question, tally)


def test_question_programs_and_hidden_flag_on_a_hand_made_scene():
    red, blue = synthetic_scenes.ATTRIBUTES["color"].index("red"), synthetic_scenes.ATTRIBUTES["color"].index("blue")
    cube = synthetic_scenes.ATTRIBUTES["shape"].index("cube")
    sphere = synthetic_scenes.ATTRIBUTES["shape"].index("sphere")
    scene = [
        {"shape": cube, "color": red, "size": 0, "material": 0, "primary": True},
        {"shape": cube, "color": red, "size": 1, "material": 0, "primary": False},
        {"shape": sphere, "color": blue, "size": 1, "material": 1, "primary": False},
    ]
    visible = [o for o in scene if o["primary"]]
    count_red_cubes = ("count", {"color": red, "shape": cube})
    assert synthetic_questions.render(count_red_cubes) == "how many red cubes are there ?"
    assert synthetic_questions.evaluate(count_red_cubes, scene) == "2"
    assert synthetic_questions.evaluate(count_red_cubes, visible) == "1"  # a hidden question
    exist_sphere = ("exist", {"shape": sphere})
    assert (synthetic_questions.evaluate(exist_sphere, scene), synthetic_questions.evaluate(exist_sphere, visible)) == ("yes", "no")
    query = ("query", "color", {"size": 1, "shape": sphere})
    assert synthetic_questions.render(query) == "what color is the large sphere ?"
    assert synthetic_questions.evaluate(query, scene) == "blue" and synthetic_questions.evaluate(query, visible) is None
    assert synthetic_questions.evaluate(("query", "size", {"shape": cube}), scene) is None  # two cubes
    more = ("more", {"color": red}, {"color": blue})
    assert synthetic_questions.render(more) == "are there more red objects than blue objects ?"
    assert synthetic_questions.evaluate(more, scene) == "yes"
    assert synthetic_questions.evaluate(("fewer", {"color": red}, {"color": blue}), scene) == "no"


def test_hidden_questions_are_those_the_primary_view_cannot_answer(medium):
    _, data = medium
    hidden, types = data["train_hidden"], data["train_question_type"]
    for qtype in synthetic_questions.QUESTION_TYPES:
        share = hidden[types == qtype].mean()
        assert 0.05 < share < 0.7, (qtype, share)
    # removing objects never turns "is there ...?" from no into yes: a "no" is never hidden
    exist_no = (types == "existence") & (data["train_answer"] == "no")
    assert exist_no.any() and not hidden[exist_no].any()


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


def test_question_prior_baseline_on_fixtures():
    """The blind baseline: best training answer per question string, else per question type."""
    dm = VQADataModule(
        data_dir="unused", source="vqav2", synthetic=None, vqav2=vqav2_config(FIXTURES),
        answer_vocab_size=4, eval_batch_size=None,
    )
    dm.setup("fit")
    prior = dm.question_prior("val")
    # "How many people are there?" is new: the number type's best train answer "2" scores 0 on
    # nine "3"s; "Is the dog sleeping?" was answered "yes" in training, and "yes" from 4 of 10
    # annotators scores min(3/3, 1) * 4/10 + min(4/3, 1) * 6/10 = 1.0
    assert prior == pytest.approx({"acc": 0.5, "acc_yes_no": 1.0, "acc_number": 0.0})


def test_synthetic_batches_carry_the_analysis_fields(tmp_path):
    dm = VQADataModule(str(tmp_path), synthetic=TINY, vqav2=None, batch_size=8, eval_batch_size=None,
                       max_boxes=24)
    dm.prepare_data()
    dm.setup("fit")
    arrays = synthetic.load(synthetic.cache_path(tmp_path, dm.synthetic_params))
    dataset = dm.datasets["val"]
    batch = dataset.__getitems__([0, 3, 5])
    images = arrays["val_image"][[0, 3, 5]]
    np.testing.assert_array_equal(batch["hidden"].numpy(), arrays["val_hidden"][[0, 3, 5]])
    kinds = synthetic.box_kinds(arrays, "val")[images]
    np.testing.assert_array_equal(batch["box_kind"].numpy(), kinds)
    # padding in box_kind is exactly the model's box mask
    np.testing.assert_array_equal((batch["box_kind"] < 0).numpy(), batch["box_mask"].numpy())
    np.testing.assert_allclose(
        batch["features"][..., :-4].numpy(), arrays["val_features"][images].astype(np.float32)
    )


def test_mirror_primary_gives_every_primary_box_a_secondary_near_duplicate():
    """The explaining-away variant: each secondary view shows every object the primary view sees
    and proposes the same background regions (with their texture); the boxes of objects the
    primary misses are then the only secondary boxes without a primary box on top of them."""
    params = synthetic.SyntheticParams(seed=0, mirror_primary=True, n_train_images=150, n_val_images=4,
                                       n_test_images=4, annotator_noise=0.15)
    data = synthetic.generate(params)
    seen = data["train_object_seen"]
    assert seen[seen[:, 0]].all()  # what the primary sees, every view sees
    assert seen.any(axis=1).all() and (~seen[:, 0]).mean() > 0.3
    center = data["train_bbox"].astype(np.float32)
    center = (center[..., :2] + center[..., 2:]) / 2
    kinds = synthetic.box_kinds(data, "train")
    nearest = {k: [] for k in synthetic.BOX_KINDS}
    for i in range(len(center)):
        primary = center[i, 0, : data["train_num_boxes"][i, 0]]
        for v in (1, 2):
            for n in range(data["train_num_boxes"][i, v]):
                d = np.linalg.norm(primary - center[i, v, n], axis=1).min()
                nearest[synthetic.BOX_KINDS[kinds[i, v, n]]].append(d)
    assert np.median(nearest["background"]) < 0.03 and np.median(nearest["visible"]) < 0.03
    assert np.median(nearest["hidden"]) > 0.08
    # the default data do not change with the option off (no extra random draws)
    default = synthetic.generate(synthetic.SyntheticParams(seed=0, **TINY))
    explicit = synthetic.generate(synthetic.SyntheticParams(seed=0, mirror_primary=False, feature_scale=1.0, **TINY))
    for key in default:
        np.testing.assert_array_equal(default[key], explicit[key])


def test_feature_scale_multiplies_the_features_only():
    base = synthetic.generate(synthetic.SyntheticParams(seed=0, **TINY))
    scaled = synthetic.generate(synthetic.SyntheticParams(seed=0, feature_scale=3.0, **TINY))
    np.testing.assert_allclose(scaled["train_features"].astype(np.float32),
                               3.0 * base["train_features"].astype(np.float32), rtol=2e-3, atol=2e-3)
    for key in ("train_bbox", "train_answers", "test_box_object"):
        np.testing.assert_array_equal(scaled[key], base[key])
    with pytest.raises(ConfigError, match="feature_scale"):
        synthetic.SyntheticParams(feature_scale=0.0)


class _Payload:
    """What a crafted info file may hold: unpickled, it runs a command (touches a file)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def test_an_info_file_is_read_as_data_and_a_crafted_one_runs_nothing(tmp_path):
    """`_info.npy` is a pickle: only numpy's arrays and numbers are unpickled from it."""
    from tasks.vqa.vqav2 import _load_info

    real = FIXTURES / "features/view_a/COCO_train2014_000000000009_info.npy"
    got, expected = _load_info(real), np.load(real, allow_pickle=True).item()
    assert got.keys() == expected.keys() and np.array_equal(got["bbox"], expected["bbox"])
    crafted = tmp_path / "x_info.npy"
    np.save(crafted, np.array({"bbox": np.zeros((1, 4)), "num_boxes": _Payload(tmp_path / "ran")},
                              dtype=object), allow_pickle=True)
    with pytest.raises(DataError, match=r"x_info\.npy \(UnpicklingError: it names posix\.system, not a numpy"):
        _load_info(crafted)
    assert not (tmp_path / "ran").exists()

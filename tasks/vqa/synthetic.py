"""A deterministic synthetic multi-view VQA benchmark (the task's embedded default data).

Each image is a scene of a few objects with discrete attributes (shape, colour, size, material)
and a position. Three "detectors" (views) look at every scene; each emits a list of box features
(padded to `max_boxes`) through its own fixed random feature extractor. The benchmark is built so
that what the doubly-normalized attention paper measures decides the answers:

- **Complementary views.** The primary view (view 0, whose boxes are the fusion's queries) misses
  a share `1 - primary_recall` of the objects, and every object it misses is seen by at least
  one secondary view. A detector that misses an object proposes nothing there: its duplicate
  boxes surround the objects it found, and only its few background boxes fall anywhere. So the
  secondary boxes of a missed object match no primary box by position, and a fusion is free to
  "explain them away" (UNAS can give them ~0 total weight), while DNAS must give every secondary
  box a total weight >= 1/S and so carries the missed object into some primary box.
- **Each view is sharp on some attributes and blurry on others** (`SHARPNESS`): the primary view
  tells shape and size apart, view 1 colour, view 2 material. "Is there a red cube?" needs the
  primary box (shape) *bound* to a secondary box of the same object (colour); the binding cue is
  the box position, which every view encodes. Concatenating all views' boxes leaves the binding
  undone; the primary view alone sees neither the missed objects nor colour or material.
- A detector's box list holds one confident box per detected object, overlapping duplicate
  proposals of it (less confident), and background boxes (no object), shuffled.

All views share one semantic feature space (extractor = shared map + a view-specific
perturbation), so the fusion's sum of raw secondary features accumulates evidence, as with the
paper's detectors of one feature dimension.

Questions come from templates (existence, counting, attribute, comparison) and are **balanced per
question string** by rejection sampling (as CLEVR and VQA-v2 do): for any one question the answers
occur about equally often, so the question alone does not give the answer away. Each question
gets ten annotator answers with realistic noise (wrong values, counts off by one, "two" for "2",
"Yes." for "yes", "a cube" for "cube"; the VQA normalization undoes the last three).

Besides features and questions, the data records per question whether its answer changes when
the objects the primary view misses are removed (`<split>_hidden`), and per box which object of
its scene it shows (`<split>_box_object`, -1 = background). Tests and the task's analysis use
them; the model never sees them.

The data set is generated with numpy from `seed` in seconds and cached under
`<data_dir>/synthetic-<hash of the generator parameters>/data.npz` (written atomically). This
module holds the parameters, the cache and the assembly of the arrays; the scenes and views are
drawn in `synthetic_scenes.py`, the questions and answers in `synthetic_questions.py`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnlab.errors import ConfigError, DataError
from attnlab.files import atomic_write, atomic_write_text
from tasks.common.cache import load_arrays
from tasks.vqa.synthetic_questions import NUM_ANSWERS_PER_QUESTION, ask
from tasks.vqa.synthetic_scenes import (
    NUM_VIEWS,
    PRIMARY_VIEW,
    descriptor_dim,
    draw_background,
    draw_objects,
    draw_view,
    scene_lists,
    view_extractors,
)

# Bump when the generator's output changes for the same parameters, so old caches are not reused.
GENERATOR_VERSION = 6

SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class SyntheticParams:
    # the fields conf/task/vqa.yaml's task.synthetic lists have its values as defaults
    seed: int = 0
    n_train_images: int = 6000
    n_val_images: int = 500
    n_test_images: int = 1000
    questions_per_image: int = 8
    max_boxes: int = 100
    feature_dim: int = 48
    appearance_dim: int = 8  # per-object appearance (texture) that every view sees
    appearance_signal: float = 1.0
    min_objects: int = 3
    max_objects: int = 7
    min_distance: float = 0.15  # between object centres in a scene (image is the unit square)
    primary_recall: float = 0.6
    secondary_recall: float = 0.7
    duplicates_per_object: float = 2.0  # mean number of extra proposals per detection (Poisson)
    min_background: int = 4  # background boxes per view and image: uniform in [min, max]
    max_background: int = 12
    attribute_signal: float = 2.0  # scales SHARPNESS: attribute evidence against box position
    attribute_noise: float = 0.5
    feature_noise: float = 0.1
    view_perturbation: float = 0.3  # how far each view's extractor is from the shared one
    annotator_noise: float = 0.1  # mean share of annotators answering wrongly
    # Every secondary detector also finds what the primary one finds: the objects it sees and the
    # same background regions, so each primary box has a near-duplicate in every secondary view
    # and the boxes of objects the primary view misses are nobody's best match (`draw_background`).
    mirror_primary: bool = False
    # Multiplies every box feature: the size of real detector features (norms of tens) makes the
    # fusion's similarity sharp; the default's features (norm ~5) keep it soft.
    feature_scale: float = 1.0
    # Answer balancing: for one question string, an answer is accepted only while it is at most
    # `balance_slack` ahead of the rarest answer seen so far for that string.
    balance_slack: int = 1

    def __post_init__(self) -> None:
        problems = []
        if not 1 <= self.min_objects <= self.max_objects:
            problems.append(
                f"need 1 <= min_objects <= max_objects, got {self.min_objects}, {self.max_objects}"
            )
        if not 0 <= self.min_background <= self.max_background:
            problems.append(
                f"need 0 <= min_background <= max_background, got {self.min_background}, "
                f"{self.max_background}"
            )
        if self.max_boxes < self.max_objects:
            problems.append(
                f"max_boxes ({self.max_boxes}) must hold one box per object "
                f"(max_objects={self.max_objects})"
            )
        if self.feature_dim < descriptor_dim(self.appearance_dim):
            problems.append(
                f"feature_dim ({self.feature_dim}) must be >= {descriptor_dim(self.appearance_dim)}"
                f" so features keep the scene information"
            )
        if not 0.0 <= self.min_distance < 0.8 / max(np.sqrt(self.max_objects), 1):
            problems.append(
                f"min_distance={self.min_distance} leaves no room for {self.max_objects} objects"
            )
        for name in ("primary_recall", "secondary_recall", "annotator_noise"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                problems.append(f"{name}={getattr(self, name)} is outside [0, 1]")
        if self.feature_scale <= 0:
            problems.append(f"feature_scale={self.feature_scale} must be > 0")
        if self.duplicates_per_object < 0 or self.balance_slack < 0:
            problems.append("duplicates_per_object and balance_slack must be >= 0")
        for name in ("n_train_images", "n_val_images", "n_test_images", "questions_per_image"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1")
        if problems:
            raise ConfigError("task.synthetic: " + "; ".join(problems))

    def digest(self) -> str:
        payload = json.dumps(
            {**dataclasses.asdict(self), "version": GENERATOR_VERSION}, sort_keys=True
        )
        return hashlib.sha1(payload.encode()).hexdigest()[:12]



def cache_path(data_dir: str | os.PathLike, params: SyntheticParams) -> Path:
    return Path(data_dir) / f"synthetic-{params.digest()}" / "data.npz"


def prepare(data_dir: str | os.PathLike, params: SyntheticParams) -> Path:
    """Generate the data set unless it is cached; return the cache file."""
    path = cache_path(data_dir, params)
    if path.exists():
        return path
    start = time.perf_counter()
    arrays = generate(params)
    # data.npz last, atomically: a crash or a concurrent run never leaves a half-written cache
    atomic_write_text(path.parent / "params.json",
                      json.dumps({**dataclasses.asdict(params), "version": GENERATOR_VERSION}, indent=2))
    with atomic_write(path) as f:
        np.savez(f, **arrays)
    print(f"[vqa] generated synthetic benchmark in {time.perf_counter() - start:.1f}s -> {path}")
    return path


def load_or_rebuild(data_dir: str | os.PathLike, params: SyntheticParams) -> dict[str, np.ndarray]:
    """The cached data set, generated first if needed; a damaged cache is generated again."""
    arrays = load_arrays(prepare(data_dir, params))
    return arrays if arrays is not None else load(prepare(data_dir, params))


def load(path: str | os.PathLike) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except Exception as err:  # zipfile/pickle/value errors: the cache is damaged
        raise DataError(
            f"cannot read the synthetic VQA cache {path} ({err}); delete that directory and run "
            f"again to regenerate it"
        ) from err


# --- generation ------------------------------------------------------------------------------


def generate(params: SyntheticParams) -> dict[str, np.ndarray]:
    """All splits as flat arrays: `<split>_features` (I, V, N, D) float16, `<split>_bbox`
    (I, V, N, 4), `<split>_num_boxes` (I, V), `<split>_box_object` (I, V, N) index of the box's
    object in its scene (-1 background or padding), `<split>_object_seen` (O, V) which views
    detect each object and `<split>_object_image` (O,) its image; per question
    `<split>_question`, `<split>_answer` (the true one), `<split>_answers` (Q, 10 annotators),
    `<split>_question_type`, `<split>_image`
    (index of the question's image) and `<split>_hidden` (the answer changes without the
    objects the primary view misses)."""
    extractors = view_extractors(np.random.default_rng(params.seed), params)
    sizes = {
        "train": params.n_train_images,
        "val": params.n_val_images,
        "test": params.n_test_images,
    }
    out: dict[str, np.ndarray] = {}
    for s, split in enumerate(SPLITS):
        rng = np.random.default_rng([params.seed, s + 1])
        # Scalar draws (question templates, annotators) use Python's generator: numpy's is slow
        # one number at a time. Both are seeded from `seed`, so the data set is deterministic.
        qrng = random.Random(f"{params.seed}-{split}")
        n_images = sizes[split]
        objects = draw_objects(rng, params, n_images)
        background = draw_background(rng, params, n_images) if params.mirror_primary else None
        features = np.zeros((n_images, NUM_VIEWS, params.max_boxes, params.feature_dim), np.float16)
        bbox = np.zeros((n_images, NUM_VIEWS, params.max_boxes, 4), np.float16)
        box_object = np.full((n_images, NUM_VIEWS, params.max_boxes), -1, np.int16)
        num_boxes = np.zeros((n_images, NUM_VIEWS), np.int16)
        first_object = np.concatenate([[0], np.cumsum(np.bincount(objects["image"], minlength=n_images))[:-1]])
        for v in range(NUM_VIEWS):
            image, slot, desc, boxes, obj = draw_view(rng, params, objects, n_images, v, background)
            noise = params.feature_noise * rng.standard_normal((len(desc), params.feature_dim))
            features[image, v, slot] = params.feature_scale * (desc @ extractors[v] + noise)
            bbox[image, v, slot] = boxes
            box_object[image, v, slot] = np.where(obj >= 0, obj - first_object[image], -1)
            num_boxes[:, v] = np.bincount(image, minlength=n_images)
        questions = ask(qrng, params, scene_lists(objects, n_images))
        out[f"{split}_features"] = features
        out[f"{split}_bbox"] = bbox
        out[f"{split}_num_boxes"] = num_boxes
        out[f"{split}_box_object"] = box_object
        out[f"{split}_object_seen"] = objects["seen"]
        out[f"{split}_object_image"] = objects["image"].astype(np.int32)
        out[f"{split}_question"] = np.array(questions["question"])
        out[f"{split}_answer"] = np.array(questions["answer"])
        out[f"{split}_answers"] = np.array(questions["answers"]).reshape(-1, NUM_ANSWERS_PER_QUESTION)
        out[f"{split}_question_type"] = np.array(questions["type"])
        out[f"{split}_image"] = np.array(questions["image"], dtype=np.int32)
        out[f"{split}_hidden"] = np.array(questions["hidden"], dtype=bool)
    return out


# What a box shows, for analysis (`box_kinds`): padding, background, an object the primary view
# sees, an object only secondary views see.
BOX_KINDS = ("background", "visible", "hidden")


def box_kinds(arrays: dict[str, np.ndarray], split: str) -> np.ndarray:
    """(I, V, N) int8: -1 padding, else the index into BOX_KINDS. Only secondary boxes can be
    "hidden" (show an object the primary view misses): the boxes a fusion must not explain away."""
    box_object = arrays[f"{split}_box_object"].astype(np.int64)
    object_image = arrays[f"{split}_object_image"]
    first = np.searchsorted(object_image, np.arange(len(box_object)))  # objects sorted by image
    index = np.minimum(first[:, None, None] + np.maximum(box_object, 0), len(object_image) - 1)
    missed = ~arrays[f"{split}_object_seen"][:, PRIMARY_VIEW]
    kinds = np.where(missed[index], 2, 1).astype(np.int8)
    kinds[box_object < 0] = 0
    padding = np.arange(box_object.shape[-1]) >= arrays[f"{split}_num_boxes"][..., None]
    kinds[padding] = -1
    return kinds

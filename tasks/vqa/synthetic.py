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
`<data_dir>/synthetic-<hash of the generator parameters>/data.npz` (written atomically).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnlab.errors import ConfigError, DataError
from tasks.common.cache import load_arrays

# Bump when the generator's output changes for the same parameters, so old caches are not reused.
GENERATOR_VERSION = 6

SPLITS = ("train", "val", "test")
QUESTION_TYPES = ("existence", "counting", "attribute", "comparison")
NUM_VIEWS = 3
PRIMARY_VIEW = 0
NUM_ANSWERS_PER_QUESTION = 10

ATTRIBUTES = {
    "shape": ("cube", "sphere", "cylinder"),
    "color": ("red", "green", "blue", "yellow"),
    "size": ("small", "large"),
    "material": ("metal", "rubber"),
}
ATTRIBUTE_NAMES = tuple(ATTRIBUTES)
# How clearly each view sees each attribute (signal amplitude against unit-variance noise
# scaled by `attribute_noise`): 1.0 sharp, 0.5 usable, 0.15 almost nothing.
#   columns: shape, color, size, material
SHARPNESS = np.array(
    [
        [1.00, 0.00, 1.00, 0.00],  # view 0, primary
        [0.00, 1.00, 0.50, 0.00],  # view 1
        [0.50, 0.00, 0.00, 1.00],  # view 2
    ]
)
POSITION_FREQUENCIES = (1, 2, 3)  # Fourier features of the box centre: what views match on
# Detector confidence ("objectness") of a box: the first box of a detected object, its
# duplicate proposals, background.
OBJECTNESS = (2.0, 1.0, 0.0)


@dataclass(frozen=True)
class SyntheticParams:
    seed: int = 0
    n_train_images: int = 3000
    n_val_images: int = 500
    n_test_images: int = 500
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
    annotator_noise: float = 0.15  # mean share of annotators answering wrongly
    # Every secondary detector also finds what the primary one finds: the objects it sees and the
    # same background regions, so each primary box has a near-duplicate in every secondary view
    # and the boxes of objects the primary view misses are nobody's best match (`_background`).
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
        if self.feature_dim < _descriptor_dim(self.appearance_dim):
            problems.append(
                f"feature_dim ({self.feature_dim}) must be >= {_descriptor_dim(self.appearance_dim)}"
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


def _descriptor_dim(appearance_dim: int = 8) -> int:
    position = 4 * len(POSITION_FREQUENCIES) + 2  # sin/cos of x and y, plus width and height
    # objectness, appearance, one-hot attribute blocks
    return position + 1 + appearance_dim + sum(len(v) for v in ATTRIBUTES.values())


def cache_path(data_dir: str | os.PathLike, params: SyntheticParams) -> Path:
    return Path(data_dir) / f"synthetic-{params.digest()}" / "data.npz"


def prepare(data_dir: str | os.PathLike, params: SyntheticParams) -> Path:
    """Generate the data set unless it is cached; return the cache file."""
    path = cache_path(data_dir, params)
    if path.exists():
        return path
    start = time.perf_counter()
    arrays = generate(params)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Write to a temporary file in the same directory, then rename: a crash or a concurrent run
    # never leaves a half-written cache behind.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".data-", suffix=".npz")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        (path.parent / "params.json").write_text(
            json.dumps({**dataclasses.asdict(params), "version": GENERATOR_VERSION}, indent=2)
        )
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
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
    extractors = _extractors(np.random.default_rng(params.seed), params)
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
        objects = _objects(rng, params, n_images)
        background = _background(rng, params, n_images) if params.mirror_primary else None
        features = np.zeros((n_images, NUM_VIEWS, params.max_boxes, params.feature_dim), np.float16)
        bbox = np.zeros((n_images, NUM_VIEWS, params.max_boxes, 4), np.float16)
        box_object = np.full((n_images, NUM_VIEWS, params.max_boxes), -1, np.int16)
        num_boxes = np.zeros((n_images, NUM_VIEWS), np.int16)
        first_object = np.concatenate([[0], np.cumsum(np.bincount(objects["image"], minlength=n_images))[:-1]])
        for v in range(NUM_VIEWS):
            image, slot, desc, boxes, obj = _view(rng, params, objects, n_images, v, background)
            noise = params.feature_noise * rng.standard_normal((len(desc), params.feature_dim))
            features[image, v, slot] = params.feature_scale * (desc @ extractors[v] + noise)
            bbox[image, v, slot] = boxes
            box_object[image, v, slot] = np.where(obj >= 0, obj - first_object[image], -1)
            num_boxes[:, v] = np.bincount(image, minlength=n_images)
        questions = _ask(qrng, params, _scenes(objects, n_images))
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


def _extractors(rng: np.random.Generator, params: SyntheticParams) -> list[np.ndarray]:
    """One fixed linear feature extractor per view: a shared map plus a view-specific part."""
    d_in = _descriptor_dim(params.appearance_dim)
    shared = rng.standard_normal((d_in, params.feature_dim)) / np.sqrt(d_in)
    return [
        shared
        + params.view_perturbation * rng.standard_normal((d_in, params.feature_dim)) / np.sqrt(d_in)
        for _ in range(NUM_VIEWS)
    ]


def _centers(rng: np.random.Generator, count: int, min_distance: float) -> np.ndarray:
    """`count` object centres in [0.1, 0.9]^2, pairwise at least `min_distance` apart (greedy
    rejection; params validation keeps the square roomy enough)."""
    centers = np.empty((count, 2))
    n = 0
    while n < count:
        candidate = rng.uniform(0.1, 0.9, 2)
        if n == 0 or np.min(np.linalg.norm(centers[:n] - candidate, axis=1)) >= min_distance:
            centers[n] = candidate
            n += 1
    return centers


def _objects(rng: np.random.Generator, params: SyntheticParams, n_images: int) -> dict:
    """The objects of all scenes of a split, flattened; `image` says whose scene each is in."""
    per_image = rng.integers(params.min_objects, params.max_objects + 1, n_images)
    n = int(per_image.sum())
    objects = {name: rng.integers(0, len(values), n) for name, values in ATTRIBUTES.items()}
    objects["image"] = np.repeat(np.arange(n_images), per_image)
    objects["center"] = np.concatenate(
        [_centers(rng, int(k), params.min_distance) for k in per_image]
    )
    extent = np.where(objects["size"] == 1, 0.16, 0.08)[:, None]  # large objects: twice as big
    objects["extent"] = extent * rng.uniform(0.8, 1.2, (n, 2))
    objects["appearance"] = params.appearance_signal * rng.standard_normal((n, params.appearance_dim))
    # Which views detect which object: independent misses, but an object the primary view
    # misses is always seen by at least one secondary view (the views are complementary).
    seen = np.stack(
        [rng.random(n) < params.primary_recall]
        + [rng.random(n) < params.secondary_recall for _ in range(NUM_VIEWS - 1)],
        axis=1,
    )
    unseen = ~seen.any(axis=1)
    rescue = rng.integers(1, NUM_VIEWS, n)
    seen[unseen, rescue[unseen]] = True
    if params.mirror_primary:  # no extra draws: the default data stay as they were
        seen[:, 1:] |= seen[:, [PRIMARY_VIEW]]
    objects["seen"] = seen
    return objects


def _background(rng: np.random.Generator, params: SyntheticParams, n_images: int) -> dict:
    """Background regions that every detector proposes (`mirror_primary`): count per image,
    first index per image, centres and extents.

    With them (and the primary view's objects seen by every view) each primary box has a
    near-duplicate in each secondary view; only the boxes of the objects the primary view misses
    have no primary counterpart. A query-normalized softmax (UNAS) that matches boxes sharply
    then gives those boxes ~0 total weight, every primary box being better served by its own
    duplicate: they are explained away. DNAS must still give each of them >= 1/S.
    """
    count = rng.integers(params.min_background, params.max_background + 1, n_images)
    total = int(count.sum())
    return {
        "count": count,
        "start": np.concatenate([[0], np.cumsum(count)[:-1]]),
        "center": rng.uniform(0.05, 0.95, (total, 2)),
        "extent": rng.uniform(0.05, 0.2, (total, 2)),
        # what every detector sees of the region (texture), as objects have
        "appearance": params.appearance_signal * rng.standard_normal((total, params.appearance_dim)),
    }


def _scenes(objects: dict, n_images: int) -> list[list[dict]]:
    """Per image, its objects as dicts of attribute indices plus `primary` (seen by view 0)."""
    scenes: list[list[dict]] = [[] for _ in range(n_images)]
    columns = [objects[a].tolist() for a in ATTRIBUTE_NAMES]
    primary = objects["seen"][:, PRIMARY_VIEW].tolist()
    for i, p, values in zip(objects["image"].tolist(), primary, zip(*columns)):
        scenes[i].append({**dict(zip(ATTRIBUTE_NAMES, values)), "primary": p})
    return scenes


def _view(rng, params: SyntheticParams, objects: dict, n_images: int, view: int,
          background: dict | None = None):
    """The boxes of one view over all images: detections, duplicates, background, shuffled
    (background: the regions every view proposes, `_background`; None: this view's own).

    Returns per box its image, its slot in that image's box list, its descriptor, its normalized
    box (x1, y1, x2, y2) and its object (index into `objects`, -1 for background).
    """
    detected = np.flatnonzero(objects["seen"][:, view])  # sorted by image
    n_dup = rng.poisson(params.duplicates_per_object, len(detected))
    n_det_image = np.bincount(objects["image"][detected], minlength=n_images)
    n_dup_image = np.bincount(objects["image"][detected], weights=n_dup, minlength=n_images)
    room = params.max_boxes - n_det_image
    # Duplicates beyond the image's room are dropped (from the end of the list), background
    # boxes fill what is left of their draw.
    dup_obj = np.repeat(detected, n_dup)
    dup_image = objects["image"][dup_obj]
    dup_rank = np.arange(len(dup_obj)) - np.repeat(
        np.concatenate([[0], np.cumsum(n_dup_image.astype(np.int64))[:-1]]), n_dup_image.astype(np.int64)
    )
    keep = dup_rank < room[dup_image]
    dup_obj = dup_obj[keep]
    n_dup_kept = np.bincount(objects["image"][dup_obj], minlength=n_images)
    n_bg = rng.integers(params.min_background, params.max_background + 1, n_images)
    if background is not None:
        n_bg = background["count"]
    n_bg = np.minimum(n_bg, room - n_dup_kept)
    det = np.concatenate([detected, dup_obj])
    kind = np.concatenate([np.zeros(len(detected), int), np.ones(len(dup_obj), int)])
    n_det = len(det)
    jitter = np.where(kind == 0, 0.01, 0.03)[:, None]
    det_center = objects["center"][det] + jitter * rng.standard_normal((n_det, 2))
    det_extent = objects["extent"][det] * rng.uniform(0.8, 1.25, (n_det, 2))

    bg_image = np.repeat(np.arange(n_images), n_bg)
    n_bg_total = len(bg_image)
    bg_center = rng.uniform(0.05, 0.95, (n_bg_total, 2))
    bg_extent = rng.uniform(0.05, 0.2, (n_bg_total, 2))
    shared = None
    if background is not None:  # the shared regions, each proposal slightly moved
        rank = np.arange(n_bg_total) - np.repeat(np.cumsum(n_bg) - n_bg, n_bg)
        shared = background["start"][bg_image] + rank
        bg_center = background["center"][shared] + 0.01 * rng.standard_normal((n_bg_total, 2))
        bg_extent = background["extent"][shared] * rng.uniform(0.8, 1.25, (n_bg_total, 2))
    center = np.concatenate([det_center, bg_center])
    extent = np.concatenate([det_extent, bg_extent])
    image = np.concatenate([objects["image"][det], bg_image])
    obj = np.concatenate([det, np.full(n_bg_total, -1)])
    kind = np.concatenate([kind, np.full(n_bg_total, 2)])
    n_boxes = len(image)

    blocks = [_position_features(center, extent)]
    objectness = np.asarray(OBJECTNESS)[kind] + 0.3 * rng.standard_normal(n_boxes)
    blocks.append(objectness[:, None])
    appearance = np.zeros((n_boxes, params.appearance_dim))
    appearance[:n_det] = objects["appearance"][det]
    if shared is not None:
        appearance[n_det:] = background["appearance"][shared]
    blocks.append(appearance + params.attribute_noise * rng.standard_normal(appearance.shape))
    for a, (name, values) in enumerate(ATTRIBUTES.items()):
        one_hot = np.zeros((n_boxes, len(values)))
        one_hot[np.arange(n_det), objects[name][det]] = params.attribute_signal * SHARPNESS[view, a]
        blocks.append(one_hot + params.attribute_noise * rng.standard_normal(one_hot.shape))
    desc = np.concatenate(blocks, axis=1)
    boxes = np.clip(np.concatenate([center - extent / 2, center + extent / 2], axis=1), 0, 1)

    # Shuffle boxes within each image (detectors do not list objects first): sort by image,
    # then by a random key; a box's slot is its rank inside its image.
    order = np.lexsort((rng.random(n_boxes), image))
    image = image[order]
    starts = np.concatenate([[0], np.cumsum(np.bincount(image, minlength=n_images))[:-1]])
    slot = np.arange(n_boxes) - starts[image]
    return image, slot, desc[order], boxes[order], obj[order]


def _position_features(center: np.ndarray, extent: np.ndarray) -> np.ndarray:
    angles = np.concatenate([np.pi * f * center for f in POSITION_FREQUENCIES], axis=1)
    # Half amplitude: position is the cue for matching boxes across views, not the content.
    return np.concatenate([0.5 * np.sin(angles), 0.5 * np.cos(angles), extent], axis=1)


# --- questions and answers -------------------------------------------------------------------
# A scene is a list of objects, each a dict {attribute name: value index, "primary": bool}.
# A question is a small program (a tuple) that `_evaluate` runs on a scene; `rng` is a
# random.Random.


def _noun(filters: dict[str, int], plural: bool = False) -> str:
    words = [ATTRIBUTES[a][filters[a]] for a in ("size", "color", "material") if a in filters]
    noun = ATTRIBUTES["shape"][filters["shape"]] if "shape" in filters else "object"
    return " ".join(words + [noun + ("s" if plural else "")])


def _count(scene: list[dict], filters: dict[str, int]) -> int:
    return sum(all(obj[a] == v for a, v in filters.items()) for obj in scene)


def _filters(rng, scene, from_scene: float) -> dict[str, int]:
    """1 or 2 attributes, taken from an object of the scene with probability `from_scene`."""
    names = rng.sample(ATTRIBUTE_NAMES, rng.randint(1, 2))
    if rng.random() < from_scene:
        obj = rng.choice(scene)
        return {a: obj[a] for a in names}
    return {a: rng.randrange(len(ATTRIBUTES[a])) for a in names}


def _program(rng, qtype: str, scene: list[dict]) -> tuple | None:
    if qtype == "existence":
        return ("exist", _filters(rng, scene, 0.5))
    if qtype == "counting":
        return ("count", _filters(rng, scene, 0.75))
    if qtype == "attribute":
        asked = rng.choice(ATTRIBUTE_NAMES)
        obj = rng.choice(scene)
        names = [a for a in ATTRIBUTE_NAMES if a != asked]
        reference = {a: obj[a] for a in rng.sample(names, rng.randint(1, 2))}
        return ("query", asked, reference)
    attr = rng.choice(ATTRIBUTE_NAMES)  # comparison of two counts of one attribute
    a, b = rng.sample(range(len(ATTRIBUTES[attr])), 2)
    return (rng.choice(("more", "fewer")), {attr: a}, {attr: b})


def _render(program: tuple) -> str:
    op = program[0]
    if op == "exist":
        return f"is there a {_noun(program[1])} ?"
    if op == "count":
        return f"how many {_noun(program[1], plural=True)} are there ?"
    if op == "query":
        return f"what {program[1]} is the {_noun(program[2])} ?"
    return f"are there {op} {_noun(program[1], True)} than {_noun(program[2], True)} ?"


def _evaluate(program: tuple, scene: list[dict]) -> str | None:
    """The answer on `scene`; None if the question does not apply (no unique referent)."""
    op = program[0]
    if op == "exist":
        return "yes" if _count(scene, program[1]) else "no"
    if op == "count":
        return str(_count(scene, program[1]))
    if op == "query":
        matches = [o for o in scene if all(o[a] == v for a, v in program[2].items())]
        return ATTRIBUTES[program[1]][matches[0][program[1]]] if len(matches) == 1 else None
    first, second = _count(scene, program[1]), _count(scene, program[2])
    return "yes" if (first > second if op == "more" else first < second) else "no"


def _ask(rng, params: SyntheticParams, scenes: list[list[dict]]) -> dict[str, list]:
    """`questions_per_image` balanced questions per image (fewer if balancing rejects too many
    candidates), the types in turn. A candidate is accepted only if its answer is at most
    `balance_slack` ahead of the rarest answer seen so far for the same question string, so that
    no question string predicts its answer."""
    tally: dict[str, Counter] = defaultdict(Counter)
    out: dict[str, list] = {
        k: [] for k in ("question", "answer", "answers", "type", "image", "hidden")
    }
    per_image = params.questions_per_image
    for i, scene in enumerate(scenes):
        visible = [o for o in scene if o["primary"]]
        for q in range(per_image):
            qtype = QUESTION_TYPES[(i * per_image + q) % len(QUESTION_TYPES)]
            for _ in range(50):
                program = _program(rng, qtype, scene)
                answer = _evaluate(program, scene)
                if answer is None:
                    continue
                question = _render(program)
                counts = tally[question]
                support = ("yes", "no") if answer in ("yes", "no") else set(counts) | {answer}
                if counts[answer] > min(counts[a] for a in support) + params.balance_slack - 1:
                    continue
                counts[answer] += 1
                out["question"].append(question)
                out["answer"].append(answer)
                out["answers"].extend(_annotate(rng, answer, params.annotator_noise))
                out["type"].append(qtype)
                out["image"].append(i)
                out["hidden"].append(_evaluate(program, visible) != answer)
                break
    return out


_NUMBER_WORDS = (
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
)


def _annotate(rng, answer: str, noise: float) -> list[str]:
    """Ten annotator answers: mostly right, some wrong in plausible ways, varied spelling."""
    p_wrong = rng.uniform(0, 2 * noise)  # some questions are harder to agree on
    answers = []
    for _ in range(NUM_ANSWERS_PER_QUESTION):
        given = _wrong_answer(rng, answer) if rng.random() < p_wrong else answer
        answers.append(_spell(rng, given))
    return answers


def _wrong_answer(rng, answer: str) -> str:
    if answer in ("yes", "no"):
        return "no" if answer == "yes" else "yes"
    if answer.isdigit():
        return str(max(0, int(answer) + rng.choice((-1, 1))))
    for values in ATTRIBUTES.values():
        if answer in values:
            return rng.choice([v for v in values if v != answer])
    return answer


def _spell(rng, answer: str) -> str:
    """How an annotator might type the answer; the official normalization maps it back."""
    r = rng.random()
    if answer.isdigit() and int(answer) <= 10 and r < 0.2:
        return _NUMBER_WORDS[int(answer)]
    if answer in ("yes", "no") and r < 0.1:
        return answer.capitalize() + "."
    if answer in ATTRIBUTES["shape"] and r < 0.1:
        return "a " + answer
    return answer

"""A deterministic synthetic multi-view VQA benchmark (the task's embedded default data).

Each image is a scene of a few objects with discrete attributes (shape, colour, size, material)
and a position. Three "detectors" (views) look at every scene and each emits up to `max_boxes`
box features through its own fixed random feature extractor:

- Recall < 1 and complementary: the primary view (view 0) misses objects that at least one
  secondary view sees, so a fusion that drops secondary boxes loses whole objects.
- Each view is sharp on some attributes and blurry on others (`SHARPNESS`): the primary view
  tells shape and size apart, view 1 colour, view 2 material. A question such as "what material
  is the large cube?" needs the primary box (to find the large cube) *bound* to a secondary box
  of the same object (to read its material). The binding cue is the box position, which all
  views encode; the fusion attention can learn to match it.
- Each view's box list (min_boxes..max_boxes long, the rest is padding) holds one box per
  detected object, then overlapping duplicate proposals of the detected objects and background
  boxes (no object), as a detector's top-100 boxes do. Duplicates make counting hard, as in VQA.

All views share one semantic feature space (extractor = shared map + a view-specific
perturbation), so the fusion's sum of raw secondary features accumulates evidence, as with the
paper's detectors of one feature dimension.

Questions come from templates (existence, counting, attribute, comparison) and get ten
annotator answers with realistic noise: wrong values, counts off by one, "two" for "2", "Yes."
for "yes", "a cube" for "cube" (the VQA answer normalization undoes the last three).

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
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnlab.errors import ConfigError, DataError

# Bump when the generator's output changes for the same parameters, so old caches are not reused.
GENERATOR_VERSION = 4

SPLITS = ("train", "val", "test")
QUESTION_TYPES = ("existence", "counting", "attribute", "comparison")
NUM_VIEWS = 3
NUM_ANSWERS_PER_QUESTION = 10

ATTRIBUTES = {
    "shape": ("cube", "sphere", "cylinder", "cone"),
    "color": ("red", "green", "blue", "yellow", "purple", "brown"),
    "size": ("small", "large"),
    "material": ("metal", "rubber"),
}
ATTRIBUTE_NAMES = tuple(ATTRIBUTES)
# How clearly each view sees each attribute (signal amplitude against unit-variance noise
# scaled by `attribute_noise`): 1.0 sharp, 0.5 usable, 0.15 almost nothing.
#   columns: shape, color, size, material
SHARPNESS = np.array(
    [
        [1.00, 0.15, 1.00, 0.15],  # view 0, primary
        [0.50, 1.00, 0.15, 0.50],  # view 1
        [0.15, 0.50, 0.50, 1.00],  # view 2
    ]
)
POSITION_FREQUENCIES = (1, 2, 3)  # Fourier features of the box centre: what views match on


@dataclass(frozen=True)
class SyntheticParams:
    seed: int = 0
    n_train_images: int = 2000
    n_val_images: int = 400
    n_test_images: int = 400
    questions_per_image: int = 8
    max_boxes: int = 100
    min_boxes: int = 60  # boxes per view and image are drawn from [min_boxes, max_boxes]
    feature_dim: int = 32
    min_objects: int = 3
    max_objects: int = 10
    primary_recall: float = 0.6
    secondary_recall: float = 0.7
    background_share: float = 0.3  # of the boxes beyond one per detected object
    attribute_signal: float = 2.0  # scales SHARPNESS: attribute evidence against box position
    attribute_noise: float = 0.5
    feature_noise: float = 0.1
    view_perturbation: float = 0.3  # how far each view's extractor is from the shared one
    annotator_noise: float = 0.15  # mean share of annotators answering wrongly

    def __post_init__(self) -> None:
        problems = []
        if not 1 <= self.min_boxes <= self.max_boxes:
            problems.append(
                f"need 1 <= min_boxes ({self.min_boxes}) <= max_boxes ({self.max_boxes})"
            )
        if not 1 <= self.min_objects <= self.max_objects:
            problems.append(
                f"need 1 <= min_objects <= max_objects, got {self.min_objects}, {self.max_objects}"
            )
        if self.max_objects > self.min_boxes:
            problems.append(
                f"min_boxes ({self.min_boxes}) must hold one box per object (max_objects={self.max_objects})"
            )
        if self.feature_dim < _descriptor_dim():
            problems.append(
                f"feature_dim ({self.feature_dim}) must be >= {_descriptor_dim()} so features keep the scene information"
            )
        for name in ("primary_recall", "secondary_recall", "background_share", "annotator_noise"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                problems.append(f"{name}={getattr(self, name)} is outside [0, 1]")
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


def _descriptor_dim() -> int:
    position = 4 * len(POSITION_FREQUENCIES) + 2  # sin/cos of x and y, plus width and height
    return position + 1 + sum(len(v) for v in ATTRIBUTES.values())  # objectness, one-hot blocks


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
    (I, V, N, 4), `<split>_num_boxes` (I, V), `<split>_question`, `<split>_answers` (Q, 10),
    `<split>_question_type`, `<split>_image` (Q,) index of the question's image."""
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
        features = np.zeros((n_images, NUM_VIEWS, params.max_boxes, params.feature_dim), np.float16)
        bbox = np.zeros((n_images, NUM_VIEWS, params.max_boxes, 4), np.float16)
        num_boxes = np.zeros((n_images, NUM_VIEWS), np.int16)
        for v in range(NUM_VIEWS):
            image, slot, desc, boxes = _view(rng, params, objects, n_images, v)
            noise = params.feature_noise * rng.standard_normal((len(desc), params.feature_dim))
            features[image, v, slot] = desc @ extractors[v] + noise
            bbox[image, v, slot] = boxes
            num_boxes[:, v] = np.bincount(image, minlength=n_images)
        questions, answers, types, images = [], [], [], []
        for i, scene in enumerate(_scenes(objects, n_images)):
            for _ in range(params.questions_per_image):
                qtype, question, answer = _question(qrng, scene)
                questions.append(question)
                answers.append(_annotate(qrng, answer, params.annotator_noise))
                types.append(qtype)
                images.append(i)
        out[f"{split}_features"] = features
        out[f"{split}_bbox"] = bbox
        out[f"{split}_num_boxes"] = num_boxes
        out[f"{split}_question"] = np.array(questions)
        out[f"{split}_answers"] = np.array(answers)
        out[f"{split}_question_type"] = np.array(types)
        out[f"{split}_image"] = np.array(images, dtype=np.int32)
    return out


def _extractors(rng: np.random.Generator, params: SyntheticParams) -> list[np.ndarray]:
    """One fixed linear feature extractor per view: a shared map plus a view-specific part."""
    d_in = _descriptor_dim()
    shared = rng.standard_normal((d_in, params.feature_dim)) / np.sqrt(d_in)
    return [
        shared
        + params.view_perturbation * rng.standard_normal((d_in, params.feature_dim)) / np.sqrt(d_in)
        for _ in range(NUM_VIEWS)
    ]


def _objects(rng: np.random.Generator, params: SyntheticParams, n_images: int) -> dict:
    """The objects of all scenes of a split, flattened; `image` says whose scene each is in."""
    per_image = rng.integers(params.min_objects, params.max_objects + 1, n_images)
    n = int(per_image.sum())
    objects = {name: rng.integers(0, len(values), n) for name, values in ATTRIBUTES.items()}
    objects["image"] = np.repeat(np.arange(n_images), per_image)
    objects["center"] = rng.uniform(0.1, 0.9, (n, 2))
    extent = np.where(objects["size"] == 1, 0.2, 0.1)[:, None]  # large objects are twice as big
    objects["extent"] = extent * rng.uniform(0.8, 1.2, (n, 2))
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
    objects["seen"] = seen
    return objects


def _scenes(objects: dict, n_images: int) -> list[list[dict]]:
    """Per image, its objects as small dicts of attribute indices (for question templates)."""
    scenes: list[list[dict]] = [[] for _ in range(n_images)]
    columns = [objects[a].tolist() for a in ATTRIBUTE_NAMES]
    for i, values in zip(objects["image"].tolist(), zip(*columns)):
        scenes[i].append(dict(zip(ATTRIBUTE_NAMES, values)))
    return scenes


def _view(rng, params: SyntheticParams, objects: dict, n_images: int, view: int):
    """The boxes of one view over all images: detections, duplicates, background, shuffled.

    Returns per box its image, its slot in that image's box list, its descriptor and its
    normalized box (x1, y1, x2, y2).
    """
    detected = np.flatnonzero(objects["seen"][:, view])  # sorted by image
    n_detected = np.bincount(objects["image"][detected], minlength=n_images)
    first_detected = np.concatenate([[0], np.cumsum(n_detected)[:-1]])
    # Every detected object gets one box; the image's remaining slots are overlapping duplicate
    # proposals of its detected objects (as a detector's top-100 boxes mostly are), except a
    # share `background_share` of background boxes (and all of them if nothing was detected).
    total = np.maximum(rng.integers(params.min_boxes, params.max_boxes + 1, n_images), n_detected)
    spare = total - n_detected
    n_background = np.where(n_detected > 0, rng.binomial(spare, params.background_share), spare)
    n_duplicates = spare - n_background
    dup_image = np.repeat(np.arange(n_images), n_duplicates)
    pick = (rng.random(len(dup_image)) * n_detected[dup_image]).astype(np.int64)
    duplicates = detected[first_detected[dup_image] + pick]
    det = np.concatenate([detected, duplicates])
    n_det = len(det)
    jitter = np.where(np.arange(n_det) < len(detected), 0.01, 0.03)[:, None]
    det_center = objects["center"][det] + jitter * rng.standard_normal((n_det, 2))
    det_extent = objects["extent"][det] * rng.uniform(0.8, 1.25, (n_det, 2))
    det_image = objects["image"][det]

    bg_image = np.repeat(np.arange(n_images), n_background)
    n_bg = len(bg_image)
    center = np.concatenate([det_center, rng.uniform(0.05, 0.95, (n_bg, 2))])
    extent = np.concatenate([det_extent, rng.uniform(0.05, 0.3, (n_bg, 2))])
    image = np.concatenate([det_image, bg_image])
    n_boxes = n_det + n_bg

    blocks = [_position_features(center, extent)]
    objectness = 2.0 * (np.arange(n_boxes) < n_det) + 0.3 * rng.standard_normal(n_boxes)
    blocks.append(objectness[:, None])
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
    starts = np.concatenate([[0], np.cumsum(total)[:-1]])
    slot = np.arange(n_boxes) - starts[image]
    return image, slot, desc[order], boxes[order]


def _position_features(center: np.ndarray, extent: np.ndarray) -> np.ndarray:
    angles = np.concatenate([np.pi * f * center for f in POSITION_FREQUENCIES], axis=1)
    # Half amplitude: position is the cue for matching boxes across views, not the content.
    return np.concatenate([0.5 * np.sin(angles), 0.5 * np.cos(angles), extent], axis=1)


# --- questions and answers -------------------------------------------------------------------
# A scene is a list of objects, each a dict {attribute name: value index}; `rng` is a
# random.Random.


def _noun(filters: dict[str, int], plural: bool = False) -> str:
    words = [ATTRIBUTES[a][filters[a]] for a in ("size", "color", "material") if a in filters]
    noun = ATTRIBUTES["shape"][filters["shape"]] if "shape" in filters else "object"
    return " ".join(words + [noun + ("s" if plural else "")])


def _count(scene: list[dict], filters: dict[str, int]) -> int:
    return sum(all(obj[a] == v for a, v in filters.items()) for obj in scene)


def _describe(obj: dict, attributes: list[str]) -> dict[str, int]:
    return {a: obj[a] for a in attributes}


def _unique_reference(rng, scene, exclude: str) -> tuple[int, dict] | None:
    """An object and a filter (1 or 2 attributes, not `exclude`) that singles it out."""
    names = [a for a in ATTRIBUTE_NAMES if a != exclude]
    for _ in range(10):
        index = rng.randrange(len(scene))
        filters = _describe(scene[index], rng.sample(names, rng.randint(1, 2)))
        if _count(scene, filters) == 1:
            return index, filters
    return None


def _question(rng, scene) -> tuple[str, str, str]:
    while True:
        qtype = rng.choice(QUESTION_TYPES)
        made = _MAKERS[qtype](rng, scene)
        if made is not None:
            return (qtype, *made)


def _existence(rng, scene):
    attrs = rng.sample(ATTRIBUTE_NAMES, rng.randint(1, 2))
    if rng.random() < 0.5:  # "yes": describe an object of the scene
        filters = _describe(rng.choice(scene), attrs)
    else:  # "no": a combination the scene lacks (keeps yes/no balanced)
        for _ in range(20):
            filters = {a: rng.randrange(len(ATTRIBUTES[a])) for a in attrs}
            if not _count(scene, filters):
                break
        else:
            return None
    answer = "yes" if _count(scene, filters) else "no"
    return f"is there a {_noun(filters)} ?", answer


def _counting(rng, scene):
    filters = _describe(rng.choice(scene), rng.sample(ATTRIBUTE_NAMES, rng.randint(1, 2)))
    return f"how many {_noun(filters, plural=True)} are there ?", str(_count(scene, filters))


def _attribute(rng, scene):
    asked = rng.choice(ATTRIBUTE_NAMES)
    ref = _unique_reference(rng, scene, exclude=asked)
    if ref is None:
        return None
    index, filters = ref
    return f"what {asked} is the {_noun(filters)} ?", ATTRIBUTES[asked][scene[index][asked]]


def _comparison(rng, scene):
    if rng.random() < 0.5:
        attr = rng.choice(ATTRIBUTE_NAMES)
        a, b = rng.sample(range(len(ATTRIBUTES[attr])), 2)
        more = _count(scene, {attr: a}) > _count(scene, {attr: b})
        question = f"are there more {_noun({attr: a}, True)} than {_noun({attr: b}, True)} ?"
        return question, "yes" if more else "no"
    asked = rng.choice(ATTRIBUTE_NAMES)
    first = _unique_reference(rng, scene, exclude=asked)
    second = _unique_reference(rng, scene, exclude=asked)
    if first is None or second is None or first[0] == second[0]:
        return None
    same = scene[first[0]][asked] == scene[second[0]][asked]
    question = f"is the {_noun(first[1])} the same {asked} as the {_noun(second[1])} ?"
    return question, "yes" if same else "no"


_MAKERS = {
    "existence": _existence,
    "counting": _counting,
    "attribute": _attribute,
    "comparison": _comparison,
}

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

"""The scenes of the synthetic VQA benchmark and what its three detectors (views) make of them.

A scene is a few objects with discrete attributes and a position; each view emits box features
through its own fixed random extractor: one confident box per object it detects, duplicate
proposals around it, and background boxes. `tasks.vqa.synthetic` says why the views differ.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from tasks.vqa.synthetic import SyntheticParams

NUM_VIEWS = 3
PRIMARY_VIEW = 0

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


def descriptor_dim(appearance_dim: int = 8) -> int:
    position = 4 * len(POSITION_FREQUENCIES) + 2  # sin/cos of x and y, plus width and height
    # objectness, appearance, one-hot attribute blocks
    return position + 1 + appearance_dim + sum(len(v) for v in ATTRIBUTES.values())


def view_extractors(rng: np.random.Generator, params: SyntheticParams) -> list[np.ndarray]:
    """One fixed linear feature extractor per view: a shared map plus a view-specific part."""
    d_in = descriptor_dim(params.appearance_dim)
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


def draw_objects(rng: np.random.Generator, params: SyntheticParams, n_images: int) -> dict:
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


def draw_background(rng: np.random.Generator, params: SyntheticParams, n_images: int) -> dict:
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


def scene_lists(objects: dict, n_images: int) -> list[list[dict]]:
    """Per image, its objects as dicts of attribute indices plus `primary` (seen by view 0)."""
    scenes: list[list[dict]] = [[] for _ in range(n_images)]
    columns = [objects[a].tolist() for a in ATTRIBUTE_NAMES]
    primary = objects["seen"][:, PRIMARY_VIEW].tolist()
    for i, p, values in zip(objects["image"].tolist(), primary, zip(*columns)):
        scenes[i].append({**dict(zip(ATTRIBUTE_NAMES, values)), "primary": p})
    return scenes


def draw_view(rng, params: SyntheticParams, objects: dict, n_images: int, view: int,
          background: dict | None = None):
    """The boxes of one view over all images: detections, duplicates, background, shuffled
    (background: the regions every view proposes, `draw_background`; None: this view's own).

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

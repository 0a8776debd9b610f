"""Reader for the real VQA-v2 data with MMF-style per-image box features, one directory per view.

Formats (exactly as distributed):
- questions JSON: {"questions": [{"image_id", "question", "question_id"}, ...]}
- annotations JSON: {"annotations": [{"question_id", "image_id", "answers": [{"answer",
  "answer_confidence", "answer_id"} x 10], "multiple_choice_answer", "answer_type",
  "question_type"}, ...]}
- features: in each view's directory, `<name>.npy` (N x D float) and `<name>_info.npy` (a pickled
  dict with `bbox` (N x 4, pixels x1 y1 x2 y2), `num_boxes`, `image_width`, `image_height`), where
  `<name>` comes from the image id through a pattern such as `COCO_train2014_{image_id:012d}`.

Boxes are truncated or zero-padded to `max_boxes`, with a padding mask; box coordinates are
normalized by the image size. Any missing or unreadable file raises one `DataError` naming it.
"""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnlab.errors import ConfigError, DataError


@dataclass
class QuestionRecord:
    question_id: int
    image_id: int
    question: str
    answers: list[str]  # the annotators' answers as typed (normally 10)
    answer_type: str  # "yes/no", "number" or "other": the per-type accuracy groups


def _read_json(path: str | os.PathLike, top_key: str) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"VQA-v2 file not found: {path}; check task.vqav2 paths in the config")
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DataError(f"cannot parse VQA-v2 JSON {path}: {err}; re-download the file") from err
    if not isinstance(data, dict) or not isinstance(data.get(top_key), list):
        raise DataError(
            f"{path} has no {top_key!r} list: is it the right file (questions vs annotations)?"
        )
    return data[top_key]


def read_split(
    questions_path: str | os.PathLike, annotations_path: str | os.PathLike
) -> list[QuestionRecord]:
    """Join the questions and annotations JSON files of one split on question_id."""
    questions = _read_json(questions_path, "questions")
    annotations = _read_json(annotations_path, "annotations")
    try:
        by_id = {int(a["question_id"]): a for a in annotations}
        records = []
        for q in questions:
            qid = int(q["question_id"])
            ann = by_id.get(qid)
            if ann is None:
                raise DataError(
                    f"question {qid} of {questions_path} has no annotation in {annotations_path}; "
                    f"are both files of the same split?"
                )
            records.append(
                QuestionRecord(
                    question_id=qid,
                    image_id=int(q["image_id"]),
                    question=str(q["question"]),
                    answers=[str(a["answer"]) for a in ann["answers"]],
                    answer_type=str(ann.get("answer_type", "other")),
                )
            )
    except (KeyError, TypeError, ValueError) as err:
        if isinstance(err, DataError):
            raise
        raise DataError(
            f"malformed VQA-v2 record in {questions_path} / {annotations_path}: missing or bad "
            f"field {err}; the files must follow the official VQA-v2 format"
        ) from err
    return records


class MMFFeatures:
    """Per-image box features of several views (detectors), loaded from disk on demand."""

    def __init__(
        self, view_dirs: Sequence[str | os.PathLike], name_pattern: str, max_boxes: int = 100
    ) -> None:
        if not view_dirs:
            raise ConfigError(
                "task.vqav2: give at least one feature directory per view (feature_dirs)"
            )
        self.view_dirs = [Path(d) for d in view_dirs]
        self.name_pattern = name_pattern
        self.max_boxes = int(max_boxes)
        self._feature_dim: int | None = None

    @property
    def num_views(self) -> int:
        return len(self.view_dirs)

    def paths(self, view: int, image_id: int) -> tuple[Path, Path]:
        try:
            name = self.name_pattern.format(image_id=image_id)
        except (KeyError, IndexError, ValueError) as err:
            raise ConfigError(
                f"feature name pattern {self.name_pattern!r} failed for image_id={image_id} ({err}); "
                f"use a pattern with {{image_id}}, e.g. 'COCO_train2014_{{image_id:012d}}'"
            ) from err
        directory = self.view_dirs[view]
        return directory / f"{name}.npy", directory / f"{name}_info.npy"

    def check_exist(self, image_ids: Sequence[int]) -> None:
        """Fail early (before training) if any feature file is missing."""
        for image_id in sorted(set(image_ids)):
            for view in range(self.num_views):
                for path in self.paths(view, image_id):
                    if not path.is_file():
                        raise DataError(
                            f"VQA-v2 feature file not found: {path} (image {image_id}, view {view}); "
                            f"extract the MMF features there or fix task.vqav2 feature_dirs / "
                            f"name_pattern"
                        )

    @property
    def feature_dim(self) -> int:
        """D of the features; read from the first file found (all views must agree)."""
        if self._feature_dim is None:
            raise ConfigError("MMFFeatures.feature_dim is known after the first load()")
        return self._feature_dim

    def load(self, image_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """features (V, max_boxes, D) float32, boxes (V, max_boxes, 4) in [0, 1], num_boxes (V,)."""
        features, boxes, counts = [], [], []
        for view in range(self.num_views):
            f, b, n = self._load_view(view, image_id)
            features.append(f)
            boxes.append(b)
            counts.append(n)
        dims = {f.shape[1] for f in features}
        if len(dims) > 1 or (self._feature_dim is not None and dims != {self._feature_dim}):
            raise DataError(
                f"views disagree on the feature dimension for image {image_id}: "
                f"{[f.shape[1] for f in features]} (expected {self._feature_dim}); all views' "
                f"features must have the same D (the fusion adds them)"
            )
        self._feature_dim = dims.pop()
        return np.stack(features), np.stack(boxes), np.array(counts, dtype=np.int64)

    def _load_view(self, view: int, image_id: int) -> tuple[np.ndarray, np.ndarray, int]:
        feature_path, info_path = self.paths(view, image_id)
        feats = _load_npy(feature_path)
        if feats.ndim != 2 or not np.issubdtype(feats.dtype, np.number):
            raise DataError(
                f"{feature_path}: expected an N x D numeric array, got {feats.dtype} {feats.shape}"
            )
        info = _load_info(info_path)
        if not isinstance(info, dict):
            raise DataError(
                f"{info_path}: expected a pickled dict (bbox, num_boxes, image_width, image_height)"
            )
        missing = [k for k in ("bbox", "num_boxes", "image_width", "image_height") if k not in info]
        if missing:
            raise DataError(
                f"{info_path}: missing keys {missing}; MMF info files hold bbox, num_boxes, image_width, image_height"
            )
        bbox = np.asarray(info["bbox"], dtype=np.float32).reshape(-1, 4)
        n = min(int(info["num_boxes"]), len(feats), len(bbox), self.max_boxes)
        width, height = float(info["image_width"]), float(info["image_height"])
        if width <= 0 or height <= 0:
            raise DataError(
                f"{info_path}: image_width/image_height must be positive, got {width} x {height}"
            )
        out_feats = np.zeros((self.max_boxes, feats.shape[1]), np.float32)
        out_feats[:n] = feats[:n]
        out_boxes = np.zeros((self.max_boxes, 4), np.float32)
        out_boxes[:n] = bbox[:n] / np.array([width, height, width, height], np.float32)
        return out_feats, np.clip(out_boxes, 0.0, 1.0), n


# what the pickle of an MMF info file (a dict of arrays and numbers, np.save'd) may name: numpy's
# arrays, dtypes and scalars; nothing that runs code
_INFO_GLOBALS = {("numpy._core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "_reconstruct"),
                 ("numpy._core.multiarray", "scalar"), ("numpy.core.multiarray", "scalar"),
                 ("numpy", "ndarray"), ("numpy", "dtype")}


class _InfoUnpickler(pickle.Unpickler):
    """A data file is data: the info dict's arrays and numbers, and no other Python object (an
    `_info.npy` is a pickle, and unpickling an arbitrary one runs its code)."""

    def find_class(self, module: str, name: str):
        if (module, name) not in _INFO_GLOBALS:
            raise pickle.UnpicklingError(f"it names {module}.{name}, not a numpy array or number")
        return super().find_class(module, name)


def _load_info(path: Path) -> dict:
    """An MMF `<image>_info.npy` (a pickled dict, np.save'd as a 0-d object array), read with
    only numpy's arrays and numbers allowed in its pickle."""
    if not path.is_file():
        raise DataError(
            f"VQA-v2 feature file not found: {path}; check task.vqav2 feature_dirs / name_pattern"
        )
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            _, _, dtype = read_header(f)
            if dtype != object:  # a plain array where a dict should be: the checks below say so
                f.seek(0)
                return np.load(f)
            info = _InfoUnpickler(f).load()
    except Exception as err:  # ValueError, EOFError, UnpicklingError, OSError: all mean corrupt
        raise DataError(
            f"corrupt feature file {path} ({type(err).__name__}: {err}); re-extract it"
        ) from err
    return info.item() if isinstance(info, np.ndarray) and info.shape == () else info


def _load_npy(path: Path) -> np.ndarray:
    if not path.is_file():
        raise DataError(
            f"VQA-v2 feature file not found: {path}; check task.vqav2 feature_dirs / name_pattern"
        )
    try:
        return np.load(path, allow_pickle=False)
    except Exception as err:  # ValueError, EOFError, UnpicklingError, OSError: all mean corrupt
        raise DataError(
            f"corrupt feature file {path} ({type(err).__name__}: {err}); re-extract it"
        ) from err

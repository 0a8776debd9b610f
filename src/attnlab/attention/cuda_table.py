"""Which CUDA kernel serves DNAS / HNAS: Triton or FlexAttention, per shape, from the table the
CUDA benchmark measured (`kernels/cuda_choices.json`, docs/gpu.md "Which CUDA kernel runs"), or
the one `pinned_cuda_path` pins. `schemes.dnas.flex_preferred` asks it per call."""

from __future__ import annotations

import contextlib
import functools
import json
from pathlib import Path

import torch

from attnlab.errors import ConfigError

CUDA_CHOICES_FILE = Path(__file__).with_name("kernels") / "cuda_choices.json"
DEFAULT_CUDA_PATH = "triton"  # where nothing was measured: it also serves dropout
CHOICE_LENGTHS = (1024, 2048, 4096, 8192, 16384)  # the buckets the bench measures


def length_bucket(length: int) -> int:
    """The measured length nearest above `length` (the largest one past them)."""
    return next((b for b in CHOICE_LENGTHS if length <= b), CHOICE_LENGTHS[-1])


def choice_key(length: int, head_dim: int, dtype: torch.dtype) -> str:
    """The table's key, e.g. "4096/64/bfloat16" (length: max(S_q, S_k))."""
    return f"{length_bucket(length)}/{head_dim}/{str(dtype).removeprefix('torch.')}"


@functools.cache
def cuda_choices() -> dict[str, str]:
    """{choice_key: "triton" | "flex"}, as measured (empty when never measured)."""
    try:
        data = json.loads(CUDA_CHOICES_FILE.read_text())
        choices = data["choices"]
    except FileNotFoundError:
        return {}
    except (ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"{CUDA_CHOICES_FILE} is not a table of CUDA path choices ({err}); "
                          f"delete it or rewrite it: python bench/attention.py --device cuda "
                          f"--write-choices") from None
    return {key: choices[key] for key in choices if choices[key] in ("triton", "flex")}


_pinned: list[str] = []  # pinned_cuda_path's stack


@contextlib.contextmanager
def pinned_cuda_path(name: str):
    """Within the block, `name` ("triton" or "flex") serves DNAS / HNAS on CUDA wherever it
    can, whatever the measured table says (benchmarks, comparisons)."""
    if name not in ("triton", "flex"):
        raise ConfigError(f"pinned_cuda_path({name!r}): the CUDA kernels are 'triton' and 'flex'")
    _pinned.append(name)
    try:
        yield
    finally:
        _pinned.pop()


# a constant to torch.compile: reading the table inside a traced region would break the graph at
# every attention call. Its arguments must be plain Python values for that (a dynamic length is a
# SymInt, which assume_constant_result cannot take): `_flex_preferred` passes the length's bucket.
@torch.compiler.assume_constant_result
def preferred_cuda_path(length: int, head_dim: int, dtype: torch.dtype) -> str:
    """"triton" or "flex": the pinned one, else the faster DNAS / HNAS kernel measured for this
    shape, else Triton (torch.compile reads it once per compiled graph)."""
    if _pinned:
        return _pinned[-1]
    return cuda_choices().get(choice_key(length, head_dim, dtype), DEFAULT_CUDA_PATH)


@torch.compiler.assume_constant_result
def measured_head_dims() -> tuple[int, ...]:
    """The head dims the table names (a constant to torch.compile, as `preferred_cuda_path`)."""
    return tuple(sorted({int(key.split("/")[1]) for key in cuda_choices()}))

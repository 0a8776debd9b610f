"""Tile configurations of the Triton DNAS / HNAS kernels, autotuned per (S, d, dtype).

`triton.autotune` times the configs of a kernel the first time it meets a key and keeps the
fastest. The key is the kernel's head dims (D, DV), its sequence lengths rounded up to a power of
two (TUNE_M, TUNE_N: a batch of new lengths does not re-tune at every step) and the dtypes of its
tensor arguments (added by Triton). The configs are the usual flash-attention shapes for Ampere
(A100) and Hopper (H100, H200): 64-128 rows owned by a program, 32-64 rows swept per step, 4-8
warps, 2-3 pipeline stages; a config that does not fit shared memory is timed as infinite by
Triton and never chosen, one that spills registers would run (slowly): `_prune` leaves out the
tiles measured to spill on each arch (`_SPILLS`). Large head dims keep only the smaller tiles:
the backward's three (rows x d) float32 accumulators would spill otherwise.

`ATTNLAB_TRITON_AUTOTUNE=0` pins the tiles: each kernel runs the first config that fits its
head dims (the largest tile `_prune` keeps), the same in every process, so results are bitwise
reproducible across processes, and a new shape costs one compile per kernel instead of 4-5
(`make gpu-check` runs so by default; its `--full` autotunes). Autotuned, another process may
time the configs differently and pick another tile: the last bits of a result can differ.

Under the interpreter (CPU tensors, tests) nothing is tuned: the caller passes one tile size
(`triton_query_normalized.INTERPRET_BLOCK`), since timing configs there would take minutes.
Not measured yet: no GPU was available when these were written (see docs/attention.md).
"""

from __future__ import annotations

import os

import torch
import triton
from triton import knobs

# (rows owned by a program, rows swept per step, num_warps, num_stages); "owned" is BLOCK_M for
# the query-side kernels (forward, backward_q) and BLOCK_N for the key-side ones
_SHAPES = {
    "column": [(128, 64, 8, 3), (64, 64, 4, 3), (64, 32, 4, 2), (32, 32, 4, 1)],
    "forward": [(128, 64, 8, 3), (128, 32, 8, 2), (64, 64, 4, 3), (64, 32, 4, 2), (32, 32, 4, 1),
                (32, 32, 8, 1)],
    "backward_kv": [(128, 32, 8, 2), (64, 64, 8, 2), (64, 32, 4, 2), (32, 32, 4, 1),
                    (32, 32, 8, 1)],
    "backward_q": [(128, 32, 8, 2), (64, 64, 8, 2), (64, 32, 4, 2), (32, 32, 4, 1)],
    # the backward with atomic dQ (_triton_atomic_dq.py): the key-side shapes
    "backward_dv_dc": [(128, 32, 8, 2), (64, 64, 8, 2), (64, 32, 4, 2), (32, 32, 4, 1),
                       (32, 32, 8, 1)],
    "backward_dk_dq": [(128, 32, 8, 2), (64, 64, 8, 2), (64, 32, 4, 2), (32, 32, 4, 1),
                       (32, 32, 8, 1)],
}
# (32, 32, 8, 1): at d = 256, where every other tile here of HNAS forward and of backward_kv
# spills, it spills on neither H100 nor A100 (8 warps: half the registers per thread of 4)
_OWNS_KEYS = {"column", "backward_kv", "backward_dv_dc", "backward_dk_dq"}
# kernels that add into an output with atomics (the autotuner zeroes it before each config)
_ATOMIC = {"backward_dk_dq"}
# owned rows x head dim above which a config's float32 accumulators spill (128 x 128 forward)
_MAX_TILE = {"column": 128 * 256, "forward": 128 * 128, "backward_kv": 64 * 128,
             "backward_q": 64 * 128, "backward_dv_dc": 128 * 128, "backward_dk_dq": 128 * 128}
# Tiles that spill registers (or overflow shared memory: forward 64x64 at d = 256 on A100,
# 168.5 KB) on H100 (90: sm_90a) or A100 (80: sm_80), found by compiling every config for both
# on a CPU (`python bench/triton_offline.py --every-config`, bf16, Triton
# 3.7.1; table in docs/gpu.md): (arch, kernel, HNAS, head dims up to) -> (owned, swept, warps)
# left out. A spilling tile still runs, slowly, and the autotuner may time it fastest of a bad
# lot; ATTNLAB_TRITON_AUTOTUNE=0 takes the first tile left. Measured, not derived: ptxas' register
# use is not monotone in the tile (HNAS backward_q at d = 128 spills at 64x64 on H100 and at
# 128x32 on A100, not the other way round). tests/bench/test_triton_offline.py
# fails when a tile left here spills.
_KV = [(128, 32, 8), (64, 64, 8), (64, 32, 4)]  # backward_kv: all but the smallest, on A100
_FWD_256 = [(64, 64, 4), (64, 32, 4), (32, 32, 4)]  # HNAS forward at d = 256: all but 8 warps
_SPILLS = {
    (90, "forward", True, 128): [(128, 64, 8), (64, 64, 4)],
    (90, "forward", False, 256): [(64, 64, 4)],
    (90, "forward", True, 256): _FWD_256,
    (90, "backward_kv", False, 64): [(32, 32, 4)],  # 8 B at d = 32, none at 64
    (90, "backward_kv", False, 128): _KV,
    (90, "backward_kv", True, 64): [(64, 64, 8)],
    (90, "backward_kv", True, 128): _KV,
    (90, "backward_kv", False, 256): [(32, 32, 4)],
    (90, "backward_kv", True, 256): [(32, 32, 4)],
    (90, "backward_q", True, 128): [(64, 64, 8)],
    (80, "forward", False, 128): [(64, 64, 4)],
    (80, "forward", True, 64): [(128, 64, 8), (64, 64, 4)],
    (80, "forward", True, 128): [(128, 64, 8), (128, 32, 8), (64, 64, 4), (64, 32, 4)],
    (80, "forward", False, 256): [(64, 64, 4), (64, 32, 4)],
    (80, "forward", True, 256): _FWD_256,
    (80, "backward_kv", False, 64): _KV,
    (80, "backward_kv", False, 128): _KV,
    (80, "backward_kv", True, 64): _KV,
    (80, "backward_kv", True, 128): _KV,
    (80, "backward_kv", False, 256): [(32, 32, 4)],
    (80, "backward_kv", True, 256): [(32, 32, 4)],
    (80, "backward_q", True, 64): [(64, 64, 8)],
    (80, "backward_q", True, 128): [(128, 32, 8)],
    # the backward with atomic dQ (its own (32, 32, 8) is clean everywhere at d = 256)
    (80, "backward_dv_dc", False, 64): [(128, 32, 8)],
    (80, "backward_dv_dc", False, 128): [(128, 32, 8)],
    (90, "backward_dv_dc", False, 256): [(64, 64, 8), (64, 32, 4)],
    (80, "backward_dv_dc", False, 256): [(64, 64, 8), (64, 32, 4)],
    (80, "backward_dv_dc", True, 64): [(128, 32, 8), (64, 64, 8), (64, 32, 4)],
    (90, "backward_dv_dc", True, 128): [(128, 32, 8), (64, 64, 8), (64, 32, 4)],
    (80, "backward_dv_dc", True, 128): [(128, 32, 8), (64, 32, 4)],
    (90, "backward_dv_dc", True, 256): [(64, 64, 8), (64, 32, 4), (32, 32, 4)],
    (80, "backward_dv_dc", True, 256): [(64, 64, 8), (64, 32, 4), (32, 32, 4)],
    (90, "backward_dk_dq", False, 64): [(128, 32, 8)],  # at d = 32, not 64
    (80, "backward_dk_dq", False, 64): [(128, 32, 8), (64, 64, 8)],
    (90, "backward_dk_dq", False, 128): [(64, 64, 8), (32, 32, 8)],
    (80, "backward_dk_dq", False, 128): [(32, 32, 8)],
    (90, "backward_dk_dq", False, 256): [(64, 64, 8), (64, 32, 4)],
    (80, "backward_dk_dq", False, 256): [(64, 64, 8), (64, 32, 4)],
    (90, "backward_dk_dq", True, 64): [(128, 32, 8), (64, 64, 8), (64, 32, 4)],
    (80, "backward_dk_dq", True, 64): [(128, 32, 8), (64, 64, 8), (64, 32, 4), (32, 32, 8)],
    (90, "backward_dk_dq", True, 128): [(64, 64, 8)],
    (90, "backward_dk_dq", True, 256): [(64, 64, 8), (64, 32, 4), (32, 32, 4)],
    (80, "backward_dk_dq", True, 256): [(64, 64, 8), (64, 32, 4)],
}


def configs(kernel: str) -> list[triton.Config]:
    out = []
    for owned, swept, warps, stages in _SHAPES[kernel]:
        m, n = (swept, owned) if kernel in _OWNS_KEYS else (owned, swept)
        out.append(triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=warps,
                                 num_stages=stages))
    return out


def _owned(kernel: str, config: triton.Config) -> int:
    return config.kwargs["BLOCK_N" if kernel in _OWNS_KEYS else "BLOCK_M"]


def _shape(kernel: str, config: triton.Config) -> tuple[int, int, int]:
    """(owned, swept, warps) of a config, as in _SHAPES."""
    m, n = config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"]
    return ((n, m) if kernel in _OWNS_KEYS else (m, n)) + (config.num_warps,)


def _arch(named_args) -> int:
    """90 on Hopper and later, else 80: the rows of _SPILLS that apply on the tensors' GPU
    (triton_offline replaces this to prune for a target without one); 90 without CUDA tensors."""
    cuda = [v for v in named_args.values() if isinstance(v, torch.Tensor) and v.is_cuda]
    return 90 if not cuda or torch.cuda.get_device_capability(cuda[0].device)[0] >= 9 else 80


def _prune(kernel: str):
    def prune(configs_, named_args, **kwargs):
        args = {**named_args, **kwargs}
        width = max(args["BLOCK_D"], args.get("BLOCK_DV", args["BLOCK_D"]))
        bucket = next((b for b in (64, 128, 256) if width <= b), width)
        spills = _SPILLS.get((_arch(named_args), kernel, bool(args.get("HYBRID")), bucket), [])
        kept = [c for c in configs_ if _owned(kernel, c) * width <= _MAX_TILE[kernel]
                and _shape(kernel, c) not in spills]
        if getattr(named_args.get("Q"), "dtype", None) == torch.float32:
            # fp32 tiles hold twice bf16's bytes and ieee dot products more registers: all but
            # one tile owning more than 32 rows spill (1-75 KB, both arches, d = 64 and 128)
            kept = [c for c in kept if _owned(kernel, c) <= 32]
        kept = kept or [min(configs_, key=lambda c: _owned(kernel, c))]
        return kept[:1] if pinned() else kept

    return prune


def pinned() -> bool:
    """ATTNLAB_TRITON_AUTOTUNE=0: one tile per kernel, no autotuning (read at every new key)."""
    return os.environ.get("ATTNLAB_TRITON_AUTOTUNE", "1") == "0"


def tuned(kernel: str, fn):
    """`fn` autotuned over `configs(kernel)`; as it is under TRITON_INTERPRET=1 (one tile size:
    the caller passes it; for CPU tensors the caller interprets `fn.fn` itself)."""
    if knobs.runtime.interpret:
        return fn
    return triton.autotune(configs(kernel), key=["TUNE_M", "TUNE_N", "D", "DV"]
                           if kernel != "column" else ["TUNE_M", "TUNE_N", "D"],
                           prune_configs_by={"early_config_prune": _prune(kernel)},
                           # each timed config adds into dQ: start every one from zeros
                           reset_to_zero=["DQ"] if kernel in _ATOMIC else None)(fn)

"""Tile configurations of the Triton DNAS / HNAS kernels, autotuned per (S, d, dtype).

`triton.autotune` times the configs of a kernel the first time it meets a key and keeps the
fastest. The key is the kernel's head dims (D, DV), its sequence lengths rounded up to a power of
two (TUNE_M, TUNE_N: a batch of new lengths does not re-tune at every step) and the dtypes of its
tensor arguments (added by Triton). The configs are the usual flash-attention shapes for Ampere
(A100) and Hopper (H100, H200): 64-128 rows owned by a program, 32-64 rows swept per step, 4-8
warps, 2-3 pipeline stages; a config that does not fit (shared memory, registers) is timed as
infinite by Triton and never chosen. Large head dims keep only the smaller tiles (`_prune`):
the backward's three (rows x d) float32 accumulators would spill otherwise.

Under the interpreter (CPU tensors, tests) nothing is tuned: the caller passes one tile size
(`triton_query_normalized.INTERPRET_BLOCK`), since timing configs there would take minutes.
Not measured yet: no GPU was available when these were written (see docs/attention.md).
"""

from __future__ import annotations

import triton
from triton import knobs

# (rows owned by a program, rows swept per step, num_warps, num_stages); "owned" is BLOCK_M for
# the query-side kernels (forward, backward_q) and BLOCK_N for the key-side ones
_SHAPES = {
    "column": [(128, 64, 8, 3), (64, 64, 4, 3), (64, 32, 4, 2), (32, 32, 4, 1)],
    "forward": [(128, 64, 8, 3), (128, 32, 8, 2), (64, 64, 4, 3), (64, 32, 4, 2), (32, 32, 4, 1)],
    "backward_kv": [(128, 32, 8, 2), (64, 64, 8, 2), (64, 32, 4, 2), (32, 32, 4, 1)],
    "backward_q": [(128, 32, 8, 2), (64, 64, 8, 2), (64, 32, 4, 2), (32, 32, 4, 1)],
}
_OWNS_KEYS = {"column", "backward_kv"}
# owned rows x head dim above which a config's float32 accumulators spill (128 x 128 forward)
_MAX_TILE = {"column": 128 * 256, "forward": 128 * 128, "backward_kv": 64 * 128,
             "backward_q": 64 * 128}


def configs(kernel: str) -> list[triton.Config]:
    out = []
    for owned, swept, warps, stages in _SHAPES[kernel]:
        m, n = (swept, owned) if kernel in _OWNS_KEYS else (owned, swept)
        out.append(triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=warps,
                                 num_stages=stages))
    return out


def _owned(kernel: str, config: triton.Config) -> int:
    return config.kwargs["BLOCK_N" if kernel in _OWNS_KEYS else "BLOCK_M"]


def _prune(kernel: str):
    def prune(configs_, named_args, **kwargs):
        args = {**named_args, **kwargs}
        width = max(args["BLOCK_D"], args.get("BLOCK_DV", args["BLOCK_D"]))
        kept = [c for c in configs_ if _owned(kernel, c) * width <= _MAX_TILE[kernel]]
        return kept or [min(configs_, key=lambda c: _owned(kernel, c))]

    return prune


def tuned(kernel: str, fn):
    """`fn` autotuned over `configs(kernel)`; as it is under TRITON_INTERPRET=1 (one tile size:
    the caller passes it; for CPU tensors the caller interprets `fn.fn` itself)."""
    if knobs.runtime.interpret:
        return fn
    return triton.autotune(configs(kernel), key=["TUNE_M", "TUNE_N", "D", "DV"]
                           if kernel != "column" else ["TUNE_M", "TUNE_N", "D"],
                           prune_configs_by={"early_config_prune": _prune(kernel)})(fn)

"""DNAS / HNAS on CUDA: the Triton kernels of `_triton_kernels.py`, registered as torch ops.

`triton` is imported on first use only, so CPU-only installs (and macOS, where it is not
installed) still import attnlab; `available()` says whether this path can run.

- **Compiled or interpreted, by device.** CUDA tensors run the compiled, autotuned kernels
  (`_triton_configs.py`). CPU tensors run the same kernel source under Triton's interpreter
  (`_kernel`): that is how the tests check the kernels without a GPU, and no `TRITON_INTERPRET`
  variable is needed for it (when it is set before triton's import, Triton interprets
  everything, CUDA tensors included). `LAUNCHES` counts the launches of each kind,
  which is how the GPU tests prove the compiled kernels ran.
- **Head dims up to `MAX_HEAD_DIM` (256)**, for d and d_v. Larger ones (e.g. VQA's fusion over
  2,048-d detector features) would need tiles past the registers and shared memory: the path
  declines (returns None, logged once), so the scheme's next path, else its reference, runs.
- **fp32 and TF32.** bf16 / fp16 inputs use tensor cores as they are. fp32 inputs follow torch's
  own matmul policy, read at every call: TF32 dot products iff
  `torch.backends.cuda.matmul.allow_tf32` (set by `torch.set_float32_matmul_precision("high")`
  or "medium"; off by default), else full-precision ("ieee") dot products. Normalizations are
  float32 always.
- **torch.compile.** The forward and the backward are `torch.library.custom_op`s
  (`attnlab::triton_query_normalized_forward` / `_backward`, in `triton_ops.py`) with fake
  (shape) implementations and a registered autograd formula, so a compiled model traces
  through them without graph breaks; the dropout seed enters as a CPU int64 tensor (drawn with
  `torch.randint`, no `.item()` in the traced code). Double backward raises one clear error.

Inputs may be bf16, fp16 or fp32 (dot products accumulate in fp32); the output has the input
dtype. Memory beyond the inputs and outputs is O(S) per head: c, dc, the row LSEs and row sums
(the LSEs and c in log2 units: the kernels exponentiate with exp2), and for HNAS the two branch
outputs and the head's fold reference (`fold_reference`).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import importlib.util
import logging
import math
import types

import torch
from torch import Tensor

from attnlab.attention.kernels import dropout

log = logging.getLogger(__name__)

MAX_HEAD_DIM = 256
# HNAS derives the UNAS weights from the DNAS exponentials (csrc/fold.h) in heads whose column
# LSEs c_j (valid keys) span at most this many nats, as the CPU kernel does
FOLD_RANGE = 60.0
# Tile size under the interpreter, where each tile operation costs ~1 ms of Python whatever its
# size: few, large tiles are fast (tests lower it to cover the loops over several blocks).
INTERPRET_BLOCK = 64
# The kernels whose programs own key blocks (and loop over the queries)
KEY_SIDE = ("column_lse", "backward_kv", "backward_dv_dc", "backward_dk_dq")
# Launches per kind ("compiled", "interpreted"): the GPU tests check which kernels ran.
LAUNCHES: collections.Counter = collections.Counter()

# a module constant, not a cached call: torch.compile traces `available` without a graph break
_INSTALLED = importlib.util.find_spec("triton") is not None


def installed() -> bool:
    return _INSTALLED


def available(device_type: str) -> bool:
    """True where the kernels can run: triton installed, CUDA (compiled) or CPU (interpreted)."""
    return _INSTALLED and device_type in ("cuda", "cpu")


@functools.cache
def _kernels():
    """The launchable kernels by name (and INTERPRETED), from both kernel files."""
    from attnlab.attention.kernels import _triton_atomic_dq, _triton_kernels

    return types.SimpleNamespace(
        INTERPRETED=_triton_kernels.INTERPRETED,
        **{name: getattr(module, name) for module, names in [
            (_triton_kernels, ("column_lse", "forward", "backward_kv", "backward_q")),
            (_triton_atomic_dq, ("backward_dv_dc", "backward_dk_dq"))] for name in names})


@functools.cache
def _interpreted(fn):
    """Triton's interpreter on the Python function `fn` of a kernel or device function."""
    from triton.runtime.interpreter import InterpretedFunction

    return InterpretedFunction(fn)


@contextlib.contextmanager
def _device_functions_interpreted():
    """While an interpreted kernel runs, @triton.jit device functions (ours, and triton's own
    `tl.sum`, `tl.cdiv`, ...: compiled ones unless TRITON_INTERPRET was set when triton was
    imported) are called through the interpreter too; restored afterwards, so that compiled
    launches in the same process are untouched."""
    from triton.runtime.jit import JITFunction

    original = JITFunction.__call__
    JITFunction.__call__ = lambda self, *args, **kwargs: _interpreted(self.fn)(*args, **kwargs)
    try:
        yield
    finally:
        JITFunction.__call__ = original


def _kernel(name: str, on_cpu: bool):
    """(launchable kernel, interpreted?): the autotuned compiled kernel for CUDA tensors, the
    interpreter on its source for CPU ones (or everywhere under TRITON_INTERPRET=1)."""
    kern = getattr(_kernels(), name)
    if _kernels().INTERPRETED:
        return kern, True
    if not on_cpu:
        return kern, False
    jit = getattr(kern, "fn", kern)  # an Autotuner wraps the JITFunction
    return _interpreted(jit.fn), True


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _bucket(n: int) -> int:
    """The autotuning key of a length: the next power of two (new lengths do not re-tune)."""
    return 1 << max(0, n - 1).bit_length()


def _launch(name: str, device: torch.device, owned_rows: int, heads: int, *args, **meta) -> None:
    """Launch kernel `name` over `heads` x blocks of `owned_rows` rows on a 1-D grid."""
    kernel, interpreted = _kernel(name, device.type == "cpu")
    owned = "BLOCK_N" if name in KEY_SIDE else "BLOCK_M"

    def grid(config):
        return (heads * _cdiv(owned_rows, config[owned]),)

    if interpreted:
        with _device_functions_interpreted():
            kernel[grid](*args, BLOCK_M=INTERPRET_BLOCK, BLOCK_N=INTERPRET_BLOCK, **meta)
    else:
        kernel[grid](*args, **meta)
    LAUNCHES["interpreted" if interpreted else "compiled"] += 1


def _meta(q: Tensor, d: int, d_v: int, m: int, n: int) -> dict:
    """Compile-time arguments shared by every kernel of one call."""
    interpreted = q.device.type == "cpu" or _kernels().INTERPRETED
    # fp32: torch's policy; bf16 / fp16: Triton's default ("tf32": ignored for them, the form
    # every half-precision Triton kernel compiles with)
    ieee = q.dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32
    return {
        "BLOCK_D": max(16, 1 << (d - 1).bit_length()),
        "BLOCK_DV": max(16, 1 << (d_v - 1).bit_length()),
        "CAST": interpreted and q.dtype == torch.bfloat16,  # no bf16 arithmetic there
        "PRECISION": "ieee" if ieee else "tf32",
        "TUNE_M": _bucket(m), "TUNE_N": _bucket(n),
    }


def _strides(*tensors: Tensor) -> list[int]:
    return [s for t in tensors for s in (t.stride(0), t.stride(1), t.stride(2))]


def _masks(key_padding_mask, query_padding_mask, dummy):
    def as_bytes(mask):
        return dummy if mask is None else mask.contiguous().view(torch.uint8)

    return (as_bytes(key_padding_mask), as_bytes(query_padding_mask),
            {"HAS_KPM": key_padding_mask is not None, "HAS_QPM": query_padding_mask is not None})


def _dropout_args(dropout_p, seed, keep_mask, dummy):
    seed_lo, seed_hi = dropout.seed_halves(0 if seed is None else int(seed))
    keep = dummy if keep_mask is None else keep_mask.contiguous().view(torch.uint8)
    args = {"seed_lo": seed_lo, "seed_hi": seed_hi, "threshold": dropout.threshold(dropout_p),
            "inv_keep": 1.0 / (1.0 - dropout_p)}
    return keep, args, {"DROPOUT": dropout_p > 0.0, "HAS_KEEP": keep_mask is not None}


def column_lse(q: Tensor, k: Tensor, query_padding_mask: Tensor | None = None) -> Tensor:
    """c (B, H, S_k) float32 in log2 units: log2 sum_i 2^(s_ij log2 e) over valid queries, i.e.
    the logsumexp of the scores times log2(e) (0 without any valid query)."""
    B, H, M, D = q.shape
    N = k.shape[2]
    c = torch.empty(B, H, N, device=q.device, dtype=torch.float32)
    _, qpm, flags = _masks(None, query_padding_mask, c)
    meta = _meta(q, D, D, M, N)
    meta.pop("BLOCK_DV")
    _launch("column_lse", q.device, N, B * H, q, k, qpm, c, *_strides(q, k), H, M, N, D,
            D**-0.5, HAS_QPM=flags["HAS_QPM"], **meta)
    return c


def fold_reference(c: Tensor, key_padding_mask: Tensor | None) -> Tensor:
    """(B*H,) float32: per head, the largest c_j (log2) over valid keys where the c_j of valid
    keys span at most FOLD_RANGE nats (the kernels then take Pu = Pd a_i b_j, one exponential),
    else +inf (Pu gets its own exponential); +inf too for heads without a valid key. Small
    torch ops on (B, H, S_k), the same in the forward and the backward."""
    if key_padding_mask is None:
        hi, lo = c.amax(-1), c.amin(-1)
    else:
        pad = key_padding_mask[:, None, :]
        hi = c.masked_fill(pad, -math.inf).amax(-1)
        lo = c.masked_fill(pad, math.inf).amin(-1)
    fold = (hi >= lo) & ((hi - lo) * math.log(2.0) <= FOLD_RANGE)
    return torch.where(fold, hi, math.inf).reshape(-1).contiguous()


def new_output(q: Tensor, d_v: int) -> Tensor:
    """(B, H, S_q, d_v) in (B, S_q, H, d_v) memory: merging the heads afterwards is a view."""
    B, H, M, _ = q.shape
    return torch.empty(B, M, H, d_v, device=q.device, dtype=q.dtype).transpose(1, 2)


def forward(q, k, v, u_bh, key_padding_mask, query_padding_mask, dropout_p, seed, keep_mask):
    """(out, c, lse_d, lse_u, o_d, o_u); the last three are empty for DNAS (u_bh None)."""
    B, H, M, D = q.shape
    N, DV = k.shape[2], v.shape[3]
    hybrid = u_bh is not None
    c = column_lse(q, k, query_padding_mask)
    out = new_output(q, DV)
    f32 = {"device": q.device, "dtype": torch.float32}
    lse_d = torch.empty(B, H, M, **f32)
    lse_u, o_d, o_u = ((torch.empty(B, H, M, **f32), torch.empty(B, H, M, DV, **f32),
                        torch.empty(B, H, M, DV, **f32)) if hybrid
                       else tuple(torch.empty(0, **f32) for _ in range(3)))
    kpm, qpm, mask_flags = _masks(key_padding_mask, query_padding_mask, c)
    keep, drop_args, drop_flags = _dropout_args(dropout_p, seed, keep_mask, c)
    cref = fold_reference(c, key_padding_mask) if hybrid else c
    _launch("forward", q.device, M, B * H,
            q, k, v, c, u_bh if hybrid else c, cref, kpm, qpm, keep, out,
            o_d if hybrid else c, o_u if hybrid else c, lse_d, lse_u if hybrid else lse_d,
            *_strides(q, k, v, out), H, M, N, D, DV, D**-0.5, **drop_args, HYBRID=hybrid,
            **mask_flags, **drop_flags, **_meta(q, D, DV, M, N))
    return out, c, lse_d, lse_u, o_d, o_u


def backward(grad, q, k, v, u_bh, c, lse_d, delta_d, lse_u, delta_u, key_padding_mask,
             query_padding_mask, dropout_p, seed, keep_mask):
    """(dq, dk, dv); lse_u / delta_u are used for HNAS only (u_bh given)."""
    B, H, M, D = q.shape
    N, DV = k.shape[2], v.shape[3]
    hybrid = u_bh is not None
    if not hybrid:
        lse_u, delta_u = lse_d, delta_d
    dk = torch.empty(B, H, N, D, device=q.device, dtype=k.dtype)
    dv = torch.empty(B, H, N, DV, device=q.device, dtype=v.dtype)
    dc = torch.empty(B, H, N, device=q.device, dtype=torch.float32)
    kpm, qpm, mask_flags = _masks(key_padding_mask, query_padding_mask, c)
    keep, drop_args, drop_flags = _dropout_args(dropout_p, seed, keep_mask, c)
    common = dict(H=H, M=M, N=N, D=D, DV=DV, scale=D**-0.5, **drop_args, HYBRID=hybrid,
                  **mask_flags, **drop_flags, **_meta(q, D, DV, M, N))
    u = u_bh if hybrid else c
    cref = fold_reference(c, key_padding_mask) if hybrid else c
    rows = (kpm, qpm, keep, lse_d, lse_u, delta_d, delta_u)
    strides = _strides(q, k, v, grad)
    if torch.are_deterministic_algorithms_enabled():
        # keys: dK, dV and dc, each program owning its keys; then queries: dQ, which needs
        # every dc_j (a second pass: _triton_kernels.py says why). No atomics: bitwise the same
        # from run to run
        dq = torch.empty(B, H, M, D, device=q.device, dtype=q.dtype)
        _launch("backward_kv", q.device, N, B * H, q, k, v, grad, c, u, cref, *rows, dk, dv, dc,
                *strides, **common)
        _launch("backward_q", q.device, M, B * H, q, k, v, grad, c, dc, u, cref, *rows, dq,
                *strides, **common)
        return dq, dk, dv
    # dV and dc first, then dK and dQ from the complete score gradient, dQ summed across key
    # blocks by float atomics (_triton_atomic_dq.py): 2 products per score fewer
    dq = torch.zeros(B, H, M, D, device=q.device, dtype=torch.float32)
    _launch("backward_dv_dc", q.device, N, B * H, q, k, v, grad, c, u, cref, *rows, dv, dc,
            *strides, **common)
    _launch("backward_dk_dq", q.device, N, B * H, q, k, v, grad, c, dc, u, cref, *rows, dk, dq,
            *strides, **common)
    return dq.to(q.dtype), dk, dv


def _last_contiguous(t: Tensor) -> Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def declines(q: Tensor, k: Tensor, v: Tensor) -> str | None:
    """Why the kernels do not take these shapes (None: they do)."""
    B, H, M, d = q.shape
    N, d_v = k.shape[2], v.shape[3]
    if max(d, d_v) > MAX_HEAD_DIM:
        return (f"head dims d={d}, d_v={d_v} exceed the Triton DNAS/HNAS kernels' limit of "
                f"{MAX_HEAD_DIM}")
    # Pointer offsets are int64 (any B*H*S*d); program ids and the dropout counter
    # (row = (b*H + h)*S_q + i, dropout.py) are 32-bit
    if B * H * max(M, N, 1) >= 2**31:
        return (f"B*H*S = {B * H * max(M, N)} rows exceed the Triton kernels' 2**31 (32-bit "
                f"program ids and dropout counter)")
    return None


@functools.cache
def log_decline(reason: str) -> None:
    log.warning("%s: running the scheme's next path (the reference on CUDA) instead", reason)

"""The fused DNAS / HNAS (and UNAS) CPU kernel (`csrc/query_normalized.cpp`): build, load, autograd.

The kernel computes the column log-sum-exp, then both normalizations and the output over blocks
of queries, and the exact gradient (including the part through the column sums) over blocks of
keys against every query, never holding more than a few such tiles per thread. HNAS also returns
its DNAS branch's output, which the backward needs for its row sums. See the C++ file for the math, and
bench/attention.py (WORK_PER_SCORE) for its matrix products and exponentials against flash's.
Attention dropout runs inside it: a counter-based keep mask (kernels/dropout.py) that the
backward regenerates from the saved seed. UNAS uses it where ATen's flash kernel does not serve
(dropout; scores too large for it), see attnlab.attention.paths.

It is compiled on first use with the machine's C++ compiler (about 15 s; `make install` does it
ahead of time) into a cache directory keyed by the source, the torch version and the CPU's
instruction set, and loaded with `torch.ops.load_library`. Where it cannot be built (no
compiler) it warns once, its fast path (attnlab.attention.paths) declines, and DNAS/HNAS run on
the composed flash-kernel path in `composed.py`, which is exact too but slower.
`ATTNLAB_FUSED_KERNEL=0` turns the kernel off.
"""

from __future__ import annotations

import hashlib
import os
import sys
import warnings
from pathlib import Path

import torch
from torch import Tensor

from attnlab.attention.kernels import dropout

# HNAS computes its UNAS weights from the DNAS ones (one exponential per score, csrc/fold.h)
# while the column log-sum-exps c_j of the valid keys of a head span at most this (kFoldRange
# there); wider spans take separate exponentials.
FOLD_RANGE = 60.0

SOURCE = Path(__file__).with_name("csrc") / "query_normalized.cpp"
HEADERS = tuple(SOURCE.with_name(name) for name in ("rows.h", "fold.h", "backward.h", "dropout.h"))
# the row-wise schemes' kernel (sigmoid, sink, softpick; kernels/rowwise.py), in the same library
ROWWISE_SOURCE = SOURCE.with_name("rowwise.cpp")
# stick-breaking's kernel (kernels/stickbreaking.py), in the same library
STICKBREAKING_SOURCE = SOURCE.with_name("stickbreaking.cpp")

# Instruction-set flags matching ATen's own CPU builds, so that at::vec::Vectorized takes the
# same wide code paths as torch's kernels.
_ISA_FLAGS = {
    "AVX512": ["-DCPU_CAPABILITY_AVX512", "-DCPU_CAPABILITY=AVX512", "-mavx512f", "-mavx512bw",
               "-mavx512vl", "-mavx512dq", "-mfma"],
    "AVX2": ["-DCPU_CAPABILITY_AVX2", "-DCPU_CAPABILITY=AVX2", "-mavx2", "-mfma", "-mf16c"],
}


def _flags() -> list[str]:
    isa = torch.backends.cpu.get_cpu_capability()
    # -fopenmp: at::parallel_for is inline OpenMP; the .so then shares torch's libgomp.so.1
    return ["-O3", "-fopenmp", *_ISA_FLAGS.get(isa, [])]


def build_dir() -> Path:
    """Where the compiled kernel lives: one folder per source (text and path), torch version and CPU ISA."""
    flags = _flags()
    # the sources' path too: ninja rebuilds when the same build dir is asked for from another
    # checkout (its build.ninja names the source by path), so each checkout keeps its own
    sources = b"".join(path.read_bytes() for path in (SOURCE, ROWWISE_SOURCE, STICKBREAKING_SOURCE, *HEADERS))
    key = hashlib.sha256(sources + " ".join(flags).encode() + str(SOURCE).encode()).hexdigest()[:12]
    tag = f"torch{torch.__version__.split('+')[0]}-{torch.backends.cpu.get_cpu_capability()}-{key}"
    root = os.environ.get("ATTNLAB_KERNEL_CACHE") or Path.home() / ".cache" / "attnlab" / "kernels"
    return Path(root) / tag


_loaded: bool | None = None  # load()'s answer, once known


def load() -> bool:
    """Build (once per machine) and load the kernel; False, with one warning, if that fails.

    The answer is kept in a module global, not a `functools.cache`: torch.compile ignores the
    cache and would trace the build (its `os.environ` write breaks the graph at every attention
    call that asks), where a known global is a constant to it. `compiling.compile_net` asks once,
    eagerly, before compiling a CPU run."""
    global _loaded
    if _loaded is None:
        _loaded = _build()
    return _loaded


def _build() -> bool:
    if os.environ.get("ATTNLAB_FUSED_KERNEL", "1") == "0":
        return False
    try:
        import ninja  # the build tool torch.utils.cpp_extension requires

        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
        from torch.utils.cpp_extension import load as build

        directory = build_dir()
        directory.mkdir(parents=True, exist_ok=True)
        name = "attnlab_query_normalized"
        if not (directory / f"{name}.so").exists():
            print(f"[attnlab] compiling the fused DNAS/HNAS CPU kernel once (~15 s) into {directory}",
                  file=sys.stderr, flush=True)
        build(name=name, sources=[str(SOURCE), str(ROWWISE_SOURCE), str(STICKBREAKING_SOURCE)], extra_cflags=_flags(), build_directory=str(directory),
              is_python_module=False, verbose=False)
        return True
    except Exception as exc:  # noqa: BLE001 - any build problem means: use the fallback
        lines = str(exc).strip().splitlines() or [""]
        reason = next((line for line in lines if "error" in line.lower()), lines[-1]).strip()
        warnings.warn(
            f"attnlab: the fused DNAS/HNAS CPU kernel could not be built ({type(exc).__name__}: "
            f"{reason}); using the slower composed flash-attention path. A C++ compiler (g++) is "
            f"needed for the fast one; ATTNLAB_FUSED_KERNEL=0 silences this.",
            stacklevel=2,
        )
        return False


def _like(t: Tensor) -> Tensor:
    """An empty tensor laid out as the C++ kernels lay out a gradient of t (zeros_like of t, or of
    its contiguous copy where its last dim is strided)."""
    return torch.empty_like(t if t.stride(-1) == 1 else t.contiguous())


# The C++ kernel as `torch.library.custom_op`s over the library's own ops: opaque to
# torch.compile, with fake implementations (shapes and strides) and the forward's autograd
# formula, so a compiled model keeps one graph through them. They take the dropout seed as a 0-d
# int64 CPU tensor (read inside the op: no `.item()` where torch.compile traces). (The C++ ops
# are looked up per call, so the library loads on first use and tests can spy on them.)
@torch.library.custom_op("attnlab::fused_query_normalized_forward", mutates_args=())
def _forward(q: Tensor, k: Tensor, v: Tensor, u_bh: Tensor | None, key_padding_mask: Tensor | None,
             query_padding_mask: Tensor | None, keep_mask: Tensor | None, seed: Tensor | None,
             column: bool, save_branch: bool, dropout_p: float
             ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(out, od, c, rd, ru): the output and what the backward needs (csrc/query_normalized.cpp)."""
    return torch.ops.attnlab.query_normalized_forward(
        q, k, v, u_bh, key_padding_mask, query_padding_mask, column, save_branch, dropout_p,
        0 if seed is None else int(seed), keep_mask)


@_forward.register_fake
def _(q, k, v, u_bh, key_padding_mask, query_padding_mask, keep_mask, seed, column, save_branch,
      dropout_p):
    B, H, M, _ = q.shape
    out = q.new_empty(B, M, H, v.shape[-1]).transpose(1, 2)  # (B, S_q, H, d_v) memory, as C++'s
    od = torch.empty_like(out) if u_bh is not None and save_branch else q.new_empty(0)
    ru = q.new_empty(B, H, M) if u_bh is not None else q.new_empty(0)
    return out, od, q.new_empty(B, H, k.shape[2]), q.new_empty(B, H, M), ru


@torch.library.custom_op("attnlab::fused_query_normalized_backward", mutates_args=())
def _backward_op(grad: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, od: Tensor,
                 u_bh: Tensor | None, c: Tensor, rd: Tensor, ru: Tensor,
                 key_padding_mask: Tensor | None, query_padding_mask: Tensor | None,
                 keep_mask: Tensor | None, seed: Tensor | None, column: bool, dropout_p: float
                 ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, du) (du: the gradient of u_bh, empty without it)."""
    return torch.ops.attnlab.query_normalized_backward(
        grad, q, k, v, out, od, u_bh, c, rd, ru, key_padding_mask, query_padding_mask, column,
        dropout_p, 0 if seed is None else int(seed), keep_mask)


@_backward_op.register_fake
def _(grad, q, k, v, out, od, u_bh, *rest):
    du = q.new_empty(q.shape[0], q.shape[1]) if u_bh is not None else q.new_empty(0)
    return _like(q), _like(k), _like(v), du


def _setup_context(ctx, inputs, output):
    q, k, v, u_bh, kpm, qpm, keep_mask, seed, column, _save_branch, dropout_p = inputs
    out, od, c, rd, ru = output
    # the backward's row sums g_i . out_i come from the output (HNAS: and from od, the
    # output of its DNAS branch), so that it needs no g v^T product for them
    ctx.save_for_backward(q, k, v, out, od, u_bh, c, rd, ru, kpm, qpm, keep_mask, seed)
    ctx.options = (column, dropout_p)


def _backward(ctx, grad, *unused):
    q, k, v, out, od, u_bh, c, rd, ru, kpm, qpm, keep_mask, seed = ctx.saved_tensors
    column, dropout_p = ctx.options
    dq, dk, dv, du = _backward_op(grad.to(q.dtype), q, k, v, out, od, u_bh, c, rd, ru, kpm, qpm,
                                  keep_mask, seed, column, dropout_p)
    return dq, dk, dv, (du if u_bh is not None else None), None, None, None, None, None, None, None


_forward.register_autograd(_backward, setup_context=_setup_context)


def seed_tensor(dropout_p: float, seed: int | None, keep_mask: Tensor | None) -> Tensor | None:
    """The dropout seed the kernels take: None without dropout (or with an explicit keep mask),
    else `seed`, or one drawn from torch's generator, as a 0-d int64 CPU tensor."""
    if dropout_p == 0.0 or keep_mask is not None:
        return None
    return dropout.draw_seed_tensor() if seed is None else torch.tensor(seed, dtype=torch.int64)


def _apply(q, k, v, u, key_padding_mask, query_padding_mask, column, dropout_p, seed, keep_mask):
    masks = [None if m is None else m.contiguous() for m in (key_padding_mask, query_padding_mask)]
    dropout_p = float(dropout_p)
    keep_mask = None if keep_mask is None or dropout_p == 0.0 else keep_mask.contiguous()
    # HNAS returns its DNAS branch's output too (od) when a backward may follow; without one
    # (no_grad, or no input needing a gradient) it mixes the weights before a single P V product,
    # a quarter less forward work.
    save_branch = u is not None and torch.is_grad_enabled() and any(
        t.requires_grad for t in (q, k, v, u))
    # u per (batch, head), contiguous (the kernel indexes it by b * H + h); autograd takes du back
    # through the expand to u's own shape
    u_bh = None if u is None else u.to(q.dtype).expand(*q.shape[:2], 1, 1).reshape(
        q.shape[:2]).contiguous()
    return _forward(q, k, v, u_bh, *masks, keep_mask, seed_tensor(dropout_p, seed, keep_mask),
                    column, save_branch, dropout_p)[0]


def query_normalized_attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    u: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
    query_padding_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    seed: int | None = None,
    keep_mask: Tensor | None = None,
) -> Tensor:
    """DNAS (u=None) or HNAS attention output (B, H, S_q, d_v) in q's dtype (float32/64).

    dropout_p > 0 drops the mixed weights with the counter-based mask of `seed` (drawn from
    torch's generator when None; kernels/dropout.py), or with `keep_mask` (bool (B, H, S_q, S_k),
    True = kept; for tests) when given.
    """
    return _apply(q, k, v, u, key_padding_mask, query_padding_mask, True, dropout_p, seed,
                  keep_mask)


def unas_attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_padding_mask: Tensor | None = None,
    query_padding_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    seed: int | None = None,
    keep_mask: Tensor | None = None,
) -> Tensor:
    """UNAS on the same kernel (no column pass); options as in `query_normalized_attend`."""
    return _apply(q, k, v, None, key_padding_mask, query_padding_mask, False, dropout_p, seed,
                  keep_mask)


def prebuild() -> None:
    """Build the kernel ahead of time (`make install` calls this) and say where it is."""
    ready = load()
    print(f"[attnlab] fused DNAS/HNAS CPU kernel: "
          f"{f'ready in {build_dir()}' if ready else 'not available, the composed fallback is used'}")

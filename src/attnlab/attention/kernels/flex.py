"""DNAS, HNAS and Sinkhorn-k through PyTorch's FlexAttention (`torch.nn.attention.flex_attention`).

FlexAttention computes softmax_j(score_mod(s_ij)) V over the (query, key) pairs its block mask
keeps, and can return the row log-sum-exp. That is enough for every query-normalized scheme,
never materializing S_q x S_k:

- DNAS: c_j = logsumexp_i s_ij is the row LSE of the *swapped* problem (keys as queries, queries
  as keys: one call, its output unused); then DNAS = softmax_j(s_ij - c_j), a `score_mod`
  reading the captured c. Gradients flow through both the LSE and the captured tensor.
- HNAS: u * O_dnas + (1 - u) * O_unas, exact because both outputs are row-stochastic weights
  times the same V (the mix is linear); O_unas is a plain FlexAttention call.
- Sinkhorn-k: log w_ij = s_ij - C_j - R_i after k rounds, with C = LSE_i(s - R) (a swapped call)
  and R = LSE_j(s - C) (a row call) alternating; the last round's row normalization is the
  output call itself. 2k calls in all (DNAS is k = 1).

Masks are `BlockMask`s: key and query padding (built block by block from the (B, S) masks, never
as a (B, S_q, S_k) tensor), optionally and-ed with a user `mask_mod` (sliding window, documents:
`sliding_window`, `document`). A (query, key) pair is kept iff neither is padding and the
mask_mod keeps it; the column passes use the transposed mask. As in reference.py, a row or column
without any kept pair is normalized against 0: its output row is 0, never NaN. A stack builds them
once per forward (`MaskCache`, made by run_stack and passed down with each call).

On CUDA the calls go through `torch.compile(flex_attention)` (fused Triton kernels, forward and
backward). Elsewhere they run eagerly (PyTorch's unfused implementation: forward only, no
backward on CPU), which is how the tests check the math on a machine without a GPU. Attention
dropout is not expressible here (it drops normalized weights, which no score_mod can): the
fast path declines dropout_p > 0.
"""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

BLOCK = 128  # FlexAttention's default sparse block size (rows and columns)
# Head dims its CUDA kernels take: larger ones need tiles past the registers and shared memory
# (the Triton path's limit too), smaller ones are below tl.dot's minimum K of 16. The path
# declines the others, logged once, and the reference runs.
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 256
# Width of the zero value tensor of the LSE-only passes (their output is unused): the smallest
# head size the CUDA kernels take.
LSE_VALUE_DIM = 16

MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]  # (b, h, q_idx, kv_idx) -> bool


@functools.cache
def installed() -> bool:
    try:
        from torch.nn.attention.flex_attention import AuxRequest, flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def available(device_type: str) -> bool:
    """True where this is a fast path: CUDA (compiled FlexAttention). Eager CPU FlexAttention
    works too (forward only) but is slower than the CPU kernels, so it is no path there."""
    return device_type == "cuda" and installed()


def declines(d: int, d_v: int) -> str | None:
    """Why the CUDA kernels cannot take these head dims, or None."""
    if max(d, d_v) > MAX_HEAD_DIM or min(d, d_v) < MIN_HEAD_DIM:
        return (f"head dims d={d}, d_v={d_v} are outside the FlexAttention paths' "
                f"{MIN_HEAD_DIM}..{MAX_HEAD_DIM}")
    return None


@functools.cache
def log_decline_once(reason: str) -> None:
    logging.getLogger(__name__).warning("%s: the materialized reference runs instead", reason)


@functools.cache
def _compiled(lse_only: bool = False, backend: str = "inductor") -> Callable:
    """flex_attention compiled with every length and batch size symbolic from the first call
    (FlexAttention keeps head dims and head counts static itself; torch specializes a size of
    1, i.e. one block of 128): per grad mode, dtype and score_mod a process compiles a graph for
    one block and one for several, never one per length. The LSE-only passes (value width 16)
    and the output passes (d_v) each have their own set of graphs (isolate_recompiles), so a
    train + validation loop compiles at most 4 graphs a set, half torch's recompile limit.
    fullgraph: past the limit it raises (`_flex` logs that once and runs unfused) instead of
    falling back to the unfused S_q x S_k path without a word."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, backend=backend, dynamic=True, fullgraph=True,
                         isolate_recompiles=True)


def _runs_compiled(t: Tensor) -> bool:
    """Compiled on CUDA (the tests route CPU tensors here, compiled with aot_eager: compiled
    CPU FlexAttention has no LSE)."""
    return t.is_cuda


@functools.cache
def log_recompile_limit_once() -> None:
    logging.getLogger(__name__).warning(
        "FlexAttention reached torch's recompile limit (torch._dynamo.config.recompile_limit = %d) "
        "and runs unfused from now on, materializing S_q x S_k: raise the limit, or use fewer "
        "dtypes / mask_mods in one process", torch._dynamo.config.recompile_limit)


@functools.cache
def _compiled_block_mask() -> Callable:
    """create_block_mask compiled: it then never materializes the (B, S_q, S_k) mask."""
    from torch.nn.attention.flex_attention import create_block_mask

    return torch.compile(create_block_mask)


def _flex(*args, lse_only: bool = False, **kwargs):
    """flex_attention: compiled on CUDA, eager elsewhere (its 'unfused' warning silenced there);
    lse_only: a pass whose output is unused (its graphs are counted apart, see `_compiled`)."""
    from torch.nn.attention.flex_attention import flex_attention

    if torch.compiler.is_compiling():  # inside torch.compile(model): traced with the rest
        return flex_attention(*args, **kwargs)
    if _runs_compiled(args[0]):
        from torch._dynamo.exc import FailOnRecompileLimitHit

        try:
            return _compiled(lse_only)(*args, **kwargs)
        except FailOnRecompileLimitHit:
            log_recompile_limit_once()
            return flex_attention(*args, **kwargs)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        return flex_attention(*args, **kwargs)


# ----------------------------------------------------------------------------- masks
def sliding_window(window: int) -> MaskMod:
    """Keep the pairs with |q_idx - kv_idx| <= window (symmetric: DNAS is for encoders)."""
    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx).abs() <= window

    return mask_mod


def document(doc_ids: Tensor) -> MaskMod:
    """Keep the pairs of one document: doc_ids (B, S) int, equal ids = one document (packed
    sequences; self-attention, so S_q = S_k)."""
    # padded to whole blocks: the kernels evaluate mask_mods at every index of a boundary block
    ids = torch.nn.functional.pad(doc_ids, (0, -doc_ids.shape[1] % BLOCK), value=-1)

    def mask_mod(b, h, q_idx, kv_idx):
        return ids[b, q_idx] == ids[b, kv_idx]

    return mask_mod


@dataclass(frozen=True)
class Masks:
    """The block masks of one call: `rows` (S_q x S_k, query i attends key j) for the row and
    output passes, `cols` (S_k x S_q, the transpose) for the column passes (None when not built:
    the row-wise schemes have none)."""

    rows: object
    cols: object | None


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _padded(pad: Tensor | None, batch: int, length: int, device) -> Tensor:
    """(B, blocks * BLOCK) bool, True = padding, also past `length`: mask_mods index it with
    any position of a boundary block, always in range."""
    out = torch.ones(batch, _cdiv(length, BLOCK) * BLOCK, dtype=torch.bool, device=device)
    out[:, :length] = False if pad is None else pad
    return out


def _padding_mask(row_pad: Tensor | None, col_pad: Tensor | None, batch: int, n_rows: int,
                  n_cols: int, device, mask_mod: MaskMod | None):
    """The BlockMask keeping (row i, column j) iff neither is padding (and mask_mod keeps it)."""
    from torch.nn.attention.flex_attention import BlockMask, and_masks, create_block_mask

    rows, cols = _padded(row_pad, batch, n_rows, device), _padded(col_pad, batch, n_cols, device)

    def padding_mod(b, h, i, j):
        return ~rows[b, i] & ~cols[b, j]

    if mask_mod is not None:  # any mask: FlexAttention's own builder (compiled on CUDA)
        on_cuda = torch.device(device).type == "cuda" and not torch.compiler.is_compiling()
        build = _compiled_block_mask() if on_cuda else create_block_mask
        return build(and_masks(padding_mod, mask_mod), batch, None, n_rows, n_cols, device=device)
    # padding alone: a block is empty, full (mask_mod not even evaluated) or partial, from the
    # per-block any / all of the two masks: O(B * blocks^2), not O(B * S_q * S_k)
    valid_r, valid_c = ((~t).view(batch, -1, BLOCK) for t in (rows, cols))
    any_r, all_r = valid_r.any(-1), valid_r.all(-1)
    any_c, all_c = valid_c.any(-1), valid_c.all(-1)
    full = (all_r[:, :, None] & all_c[:, None, :])[:, None]  # (B, 1, row blocks, col blocks)
    partial = (any_r[:, :, None] & any_c[:, None, :])[:, None] & ~full

    def ordered(dense: Tensor) -> tuple[Tensor, Tensor]:  # counts and column-block indices
        dense = dense.to(torch.int32)
        order = torch.argsort(dense, dim=-1, descending=True, stable=True)
        return dense.sum(-1).to(torch.int32), order.to(torch.int32).contiguous()

    return BlockMask.from_kv_blocks(*ordered(partial), *ordered(full), BLOCK_SIZE=BLOCK,
                                    mask_mod=padding_mod, seq_lengths=(n_rows, n_cols))


def block_masks(batch: int, s_q: int, s_k: int, device, key_padding_mask: Tensor | None = None,
                query_padding_mask: Tensor | None = None, mask_mod: MaskMod | None = None,
                transposed: bool = True) -> Masks:
    """Both orientations of the mask (padding bool (B, S), True = padding; mask_mod (b, h,
    q_idx, kv_idx) -> bool, True = keep, the same for every head); transposed=False: `rows` only."""
    swapped = None if mask_mod is None else (lambda b, h, j, i: mask_mod(b, h, i, j))
    return Masks(
        _padding_mask(query_padding_mask, key_padding_mask, batch, s_q, s_k, device, mask_mod),
        _padding_mask(key_padding_mask, query_padding_mask, batch, s_k, s_q, device, swapped)
        if transposed else None,
    )


class MaskCache:
    """The block masks of one forward of a stack, built on first use and reused by its layers.

    `run_stack` makes one per forward and hands it down with each call (`AttentionCall.mask_cache`),
    as it hands down the cascade logits: nothing is kept on a module or between forwards, so a
    new padding mask always gets new block masks. Every layer of a stack passes the same mask
    tensors, so an entry is found by their identity (`is`, also under torch.compile), with the
    shapes and the mask_mod, never by their values (comparing them would cost a sync)."""

    def __init__(self) -> None:
        self._entries: list[tuple[tuple, tuple, Masks]] = []  # (objects, sizes, masks)

    def get(self, batch: int, s_q: int, s_k: int, device, key_padding_mask: Tensor | None = None,
            query_padding_mask: Tensor | None = None, mask_mod: MaskMod | None = None,
            transposed: bool = True) -> Masks:
        """`block_masks(...)` of these arguments, built at the first call of this forward."""
        objects = (key_padding_mask, query_padding_mask, mask_mod)
        sizes = (batch, s_q, s_k, torch.device(device), transposed)
        for known, known_sizes, masks in self._entries:
            if known_sizes == sizes and all(a is b for a, b in zip(known, objects)):
                return masks
        masks = block_masks(batch, s_q, s_k, device, key_padding_mask, query_padding_mask,
                            mask_mod, transposed)
        self._entries.append((objects, sizes, masks))
        return masks


# ----------------------------------------------------------------------------- the schemes
def _minus(bias: Tensor) -> Callable:
    """score_mod s - bias[b, h, kv_idx] (bias float32 (B, H, S_kv))."""
    def score_mod(score, b, h, q_idx, kv_idx):
        return score - bias[b, h, kv_idx]

    return score_mod


def _attend(query: Tensor, key: Tensor, value: Tensor, bias: Tensor | None, block_mask,
            scale: float, lse_only: bool = False) -> tuple[Tensor, Tensor]:
    """softmax_j(query_i . key_j * scale - bias_j) value over kept pairs, and its row LSE
    (float32 (B, H, S)), where a row without any kept pair has LSE 0 (normalized against 0, as
    reference.safe_log_normalize), not -inf.

    Every call has the same form (a score_mod, a block mask, the LSE), whatever the pass: one
    compiled graph per shape, not one per combination of options, so that varying lengths never
    reach torch.compile's recompilation limit (past it, FlexAttention would run unfused)."""
    from torch.nn.attention.flex_attention import AuxRequest

    if bias is None:
        bias = query.new_zeros(*key.shape[:3], dtype=torch.float32)
    out, aux = _flex(query, key, value, score_mod=_minus(bias), block_mask=block_mask,
                     scale=scale, return_aux=AuxRequest(lse=True), lse_only=lse_only)
    lse = aux.lse.float()
    return out, torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)


def _lse(query: Tensor, key: Tensor, bias: Tensor | None, block_mask, scale: float) -> Tensor:
    """The row LSE alone (the value is a zero (B, H, S, 16) tensor: its product costs ~nothing)."""
    return _attend(query, key, key.new_zeros(*key.shape[:3], LSE_VALUE_DIM), bias, block_mask,
                   scale, lse_only=True)[1]


def query_normalized_attend_flex(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    u: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
    query_padding_mask: Tensor | None = None,
    n_iter: int = 1,
    mask_mod: MaskMod | None = None,
    masks: Masks | None = None,
) -> Tensor:
    """DNAS (u None, n_iter 1), HNAS (u given: the weight of DNAS, broadcastable to (B, H, 1, 1))
    or Sinkhorn with n_iter rounds; output (B, H, S_q, d_v) in q's dtype.

    q (B, H, S_q, d), k (B, H, S_k, d), v (B, H, S_k, d_v), all one dtype; masks bool (B, S),
    True = padding; `mask_mod` keeps pairs besides (e.g. `sliding_window(256)`), or pass
    prebuilt `masks` (`block_masks(...)`) to reuse them across layers.
    """
    if u is not None and n_iter != 1:
        raise ValueError("HNAS mixes DNAS (n_iter=1) with UNAS; got u together with n_iter > 1")
    B, _, s_q, d = q.shape
    if masks is None:
        masks = block_masks(B, s_q, k.shape[2], q.device, key_padding_mask, query_padding_mask,
                            mask_mod)
    scale = d ** -0.5
    row_bias = None
    for round_ in range(n_iter):
        col_bias = _lse(k, q, row_bias, masks.cols, scale)  # C_j = LSE_i (s_ij - R_i)
        if round_ < n_iter - 1:
            row_bias = _lse(q, k, col_bias, masks.rows, scale)  # R_i = LSE_j (s_ij - C_j)
    out = _attend(q, k, v, col_bias, masks.rows, scale)[0]
    if u is None:
        return out
    unas = _attend(q, k, v, None, masks.rows, scale)[0]
    u = u.float()
    return (u * out.float() + (1 - u) * unas.float()).to(q.dtype)

"""Calls that run correctly but slower than they could, said once per process in one line with
the reason and the fix (in a training loop a warning would repeat every step). The dispatcher
(`paths.FastPath`, UNAS's SDPA path) and `Normalizer.attend` call these with the device
they decided on, so tests route CPU tensors as CUDA ones through `paths.device_type`.

`log_once` is cached: a test that expects a line clears it first (`notices.log_once.cache_clear()`),
or another test in the same process may have logged it already.
"""

from __future__ import annotations

import functools
import logging

import torch

# the CUDA paths whose fp32 dot products follow torch's TF32 flag (Triton's input_precision,
# Inductor's compiled FlexAttention); SDPA's kernels choose their own
TF32_PATHS = ("triton", "flex")


@functools.cache
def log_once(message: str) -> None:
    logging.getLogger(__name__).warning(message)


def _quiet() -> bool:
    return torch.compiler.is_compiling()  # nothing logged from inside a traced graph


def fp32_without_tf32(path: str, device: str, dtype: torch.dtype) -> None:
    if (device == "cuda" and dtype == torch.float32 and path in TF32_PATHS
            and not torch.backends.cuda.matmul.allow_tf32 and not _quiet()):
        log_once("fp32 attention on CUDA without TF32 runs full-precision dot products, not tensor "
                 "cores: torch.set_float32_matmul_precision('high') for TF32, or bf16 (hardware=gpu)")


def key_padding_keeps_flash_off(device: str, dtype: torch.dtype, key_padding: bool) -> None:
    """UNAS on SDPA: flash serves fp16 / bf16 calls without a mask only."""
    if device == "cuda" and key_padding and dtype in (torch.float16, torch.bfloat16) and not _quiet():
        log_once("UNAS with a key padding mask on CUDA: SDPA's flash kernel takes no mask, so its "
                 "memory-efficient kernel runs: for flash, give batches without padding "
                 "key_padding_mask=None (e.g. batches of one length)")


def dropout_keeps_fast_paths_off(normalizer, device: str, dtype: torch.dtype, dropout_p: float,
                                 causal: bool) -> None:
    """Before a call runs on the reference: where attention dropout alone keeps a fast path from
    it (Sinkhorn n_iter > 1 on CUDA: FlexAttention drops no weights)."""
    if dropout_p == 0.0 or _quiet():
        return
    best = normalizer.candidates(device, dtype, 0.0, causal)[0]
    if best != "reference":
        log_once(f"{normalizer.name} with attention dropout on {device}: no fast path drops its "
                 f"weights, so the materialized reference runs (S_q x S_k memory): set the "
                 f"attention dropout to 0 (the task's attention_dropout / attn_dropout) for the "
                 f"{best} path")

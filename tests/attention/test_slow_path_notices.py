"""Calls that run slower than they could say so once per process, with the reason and the fix
(`attnlab.attention.notices`): attention dropout keeping Sinkhorn-k off FlexAttention, a key padding mask
keeping UNAS off SDPA's flash kernel, fp32 without TF32. CUDA calls are CPU tensors routed as
CUDA ones through the dispatcher's device check (`paths.device_type`)."""

from __future__ import annotations

import logging

import pytest
import torch
from helpers.kernel_cases import padded_problem

from attnlab.attention import attend, notices, paths
from attnlab.attention.functional import normalizer
from attnlab.attention.kernels import triton_ops, triton_query_normalized
from attnlab.attention.schemes import dnas, unas


@pytest.fixture(autouse=True)
def fresh_notices():
    # once per process: another test in this worker may have logged the same line already
    notices.log_once.cache_clear()
    yield
    notices.log_once.cache_clear()


@pytest.fixture
def as_cuda(monkeypatch):
    monkeypatch.setattr(paths, "device_type", lambda t: "cuda")
    monkeypatch.setattr(triton_query_normalized, "available", lambda device: device == "cuda")


def said(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == notices.__name__]


def test_sinkhorn_with_dropout_says_once_that_the_reference_runs(as_cuda, caplog):
    q, k, v, _, kpm, qpm = padded_problem(6, 6, 16, H=2, seed=1)
    with caplog.at_level(logging.WARNING, logger=notices.__name__):
        for _ in range(3):
            out = attend(q, k, v, "sinkhorn", kpm, qpm, dropout_p=0.1, n_iter=3)
    assert torch.isfinite(out).all()
    assert said(caplog) == [(
        "sinkhorn with attention dropout on cuda: no fast path drops its weights, so the materialized "
        "reference runs (S_q x S_k memory): set the attention dropout to 0 (the task's "
        "attention_dropout / attn_dropout) for the flex path")]


def test_no_dropout_notice_where_the_reference_runs_anyway(caplog):
    """On the CPU Sinkhorn-3 has no fast path with or without dropout: nothing to say."""
    q, k, v, _, kpm, qpm = padded_problem(6, 6, 16, H=2, seed=1)
    with caplog.at_level(logging.WARNING, logger=notices.__name__):
        attend(q, k, v, "sinkhorn", kpm, qpm, dropout_p=0.1, n_iter=3)
        attend(q, k, v, "entmax", kpm, qpm, dropout_p=0.1)
    assert said(caplog) == []


def test_unas_with_key_padding_on_cuda_says_once_that_flash_cannot_serve(as_cuda, caplog):
    q, k, v, _, kpm, qpm = padded_problem(6, 6, 16, H=2, seed=2, dtype=torch.bfloat16)
    norm, _ = normalizer("unas")
    with caplog.at_level(logging.WARNING, logger=notices.__name__):
        assert unas.SDPA(norm, norm.call(q, k, v, None, qpm)) is not None  # no key mask: flash
        assert said(caplog) == []
        for _ in range(2):
            assert unas.SDPA(norm, norm.call(q, k, v, kpm, qpm)) is not None
    [line] = said(caplog)
    assert "SDPA's flash kernel takes no mask, so its memory-efficient kernel runs" in line
    assert "key_padding_mask=None" in line


@pytest.fixture
def tf32():
    """Sets torch's TF32 flag (a property of torch.backends.cuda.matmul) and restores it."""
    before = torch.backends.cuda.matmul.allow_tf32

    def set_to(on: bool) -> None:
        torch.backends.cuda.matmul.allow_tf32 = on

    yield set_to
    torch.backends.cuda.matmul.allow_tf32 = before


def test_fp32_without_tf32_says_once_how_to_get_tensor_cores(as_cuda, tf32, monkeypatch, caplog):
    monkeypatch.setattr(triton_ops, "query_normalized_attend_triton",
                        lambda q, k, v, *a, **kw: torch.zeros(*q.shape[:3], v.shape[-1], dtype=q.dtype))
    tf32(False)
    norm, inputs = normalizer("hnas", u=torch.tensor(0.3))
    q, k, v, _, kpm, qpm = padded_problem(6, 6, 16, seed=3)
    with caplog.at_level(logging.WARNING, logger=notices.__name__):
        for _ in range(2):
            assert dnas.TRITON(norm, norm.call(q, k, v, kpm, qpm, **inputs)) is not None
    assert said(caplog) == [(
        "fp32 attention on CUDA without TF32 runs full-precision dot products, not tensor cores: "
        "torch.set_float32_matmul_precision('high') for TF32, or bf16 (hardware=gpu)")]

    caplog.clear()
    notices.log_once.cache_clear()
    with caplog.at_level(logging.WARNING, logger=notices.__name__):
        tf32(True)  # TF32 on: nothing to say
        dnas.TRITON(norm, norm.call(q, k, v, kpm, qpm, **inputs))
        tf32(False)  # bf16: tensor cores anyway
        half = [x.bfloat16() for x in (q, k, v)]
        dnas.TRITON(norm, norm.call(*half, kpm, qpm, **inputs))
    assert said(caplog) == []


def test_causal_stickbreaking_with_dropout_says_that_the_blocked_kernel_serves_without_it(caplog):
    """Causal (stick-breaking is causal only) and on the CPU: by blocks without dropout, on the
    reference with it."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 130, 8) for _ in range(3))
    with caplog.at_level(logging.WARNING, logger=notices.__name__):
        out = attend(q, k, v, "stickbreaking", causal=True, dropout_p=0.1)
    assert torch.isfinite(out).all()
    assert said(caplog) == [(
        "stickbreaking with attention dropout on cpu: no fast path drops its weights, so the "
        "materialized reference runs (S_q x S_k memory): set the attention dropout to 0 (the task's "
        "attention_dropout / attn_dropout) for the blocked path")]

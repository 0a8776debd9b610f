"""What `attention/paths.py` hands its kernels on the CPU: inputs cast to the working dtype,
dropout at its boundary (p = 1), which UNAS path takes a padding mask, the options a path must
pass on. The CUDA side of the same dispatch: tests/attention/test_flex_paths.py (CPU tensors
routed as CUDA ones) and tests/gpu/."""

from __future__ import annotations

import pytest
import torch
from helpers.kernel_cases import padded_problem, reference_out

from attnlab.attention import attend, attention_weights
from attnlab.attention.functional import candidates, route
from attnlab.attention.kernels import fused, sdpa

FUSED_SCHEMES = ["dnas", "hnas", "unas", "sigmoid", "sink", "softpick", "ssmax"]


def _problem(scheme, dtype, seed=0):
    q, k, v, u, kpm, qpm = padded_problem(9, 7, 8, B=2, H=2, seed=seed)
    extra = {"u": u.to(dtype)} if scheme == "hnas" else {}
    return [t.to(dtype) for t in (q, k, v)], kpm, qpm, extra


@pytest.mark.parametrize("scheme", FUSED_SCHEMES)
def test_half_precision_inputs_run_the_cpu_kernels_in_float32(scheme):
    """bf16 q, k, v (and u) on the CPU: the fused paths compute in float32 (the working dtype)
    and return bf16: the float32 run of the same values, rounded once."""
    (q, k, v), kpm, qpm, extra = _problem(scheme, torch.bfloat16)
    assert route(q, k, v, scheme, kpm, qpm, **extra) in ("fused_cpu", "scaled_fused_cpu")
    out = attend(q, k, v, scheme, kpm, qpm, **extra)
    wide = attend(q.float(), k.float(), v.float(), scheme, kpm, qpm,
                  **{name: t.float() for name, t in extra.items()})
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, wide.to(torch.bfloat16), atol=0, rtol=0)


@pytest.mark.parametrize("scheme", FUSED_SCHEMES + ["sinkhorn", "entmax", "esp"])
def test_dropout_of_one_drops_every_weight(scheme):
    """p = 1 (which the fast paths decline): zeros, and finite zero gradients, as torch's own
    dropout gives; not the 0 * inf = NaN of scaling by 1 / (1 - p)."""
    assert "fused_cpu" not in candidates(scheme, "cpu", torch.float32, 1.0)
    (q, k, v), kpm, qpm, extra = _problem(scheme, torch.float32, seed=4)
    q.requires_grad_()
    out = attend(q, k, v, scheme, kpm, qpm, dropout_p=1.0, **extra)
    assert torch.equal(out, torch.zeros_like(out))
    out.sum().backward()
    assert torch.equal(q.grad, torch.zeros_like(q))


@pytest.mark.parametrize("masks", ["keys", "queries"])
def test_unas_with_any_padding_mask_runs_the_fused_kernel_on_the_cpu(monkeypatch, masks):
    """Either mask alone sends UNAS past SDPA to the fused kernel (measured faster with a mask)."""
    ran = []
    for module, name in [(sdpa, "unas_sdpa"), (fused, "unas_attend")]:
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _n=name, _r=real, **kw: ran.append(_n) or _r(*a, **kw))
    (q, k, v), kpm, qpm, _ = _problem("unas", torch.float32, seed=5)
    kpm, qpm = (kpm, None) if masks == "keys" else (None, qpm)
    out = attend(q, k, v, "unas", kpm, qpm)
    assert ran == ["unas_attend"]
    torch.testing.assert_close(out.double(), reference_out(q, k, v, "unas", kpm, qpm),
                               atol=1e-5, rtol=0)
    attend(q, k, v, "unas")
    assert ran[1:] == ["unas_sdpa"]  # no mask: SDPA


@pytest.mark.parametrize("attend_current", [False, True])
def test_stickbreaking_by_blocks_keeps_its_attend_current_option(attend_current):
    """Past one block (S_q S_k > MIN_PAIRS) the blocked kernel serves stick-breaking; its output
    is the materialized weights' with the scheme's own `attend_current`."""
    torch.manual_seed(6)
    q, k, v = (torch.randn(1, 2, 130, 8, dtype=torch.float64) for _ in range(3))
    assert route(q, k, v, "stickbreaking", causal=True, attend_current=attend_current) == "blocked"
    out = attend(q, k, v, "stickbreaking", causal=True, attend_current=attend_current)
    weights = attention_weights(q, k, "stickbreaking", causal=True, attend_current=attend_current)
    torch.testing.assert_close(out, weights @ v, atol=1e-10, rtol=0)
    assert (weights[..., 0, 0] > 0).all() == attend_current  # row 0 has only itself as a key


def test_causal_ssmax_with_dropout_stays_causal_on_the_cpu():
    """The fused UNAS kernel under SSMax's scaled queries takes no causal mask: causal SSMax
    with dropout must not reach it (the positions before the last do not see the last value)."""
    torch.manual_seed(7)
    q, k, v = (torch.randn(2, 2, 10, 8) for _ in range(3))
    moved = v.clone()
    moved[:, :, -1] += 5.0

    def run(values):
        torch.manual_seed(8)  # the same dropout mask in both runs
        return attend(q, k, values, "ssmax", causal=True, dropout_p=0.3)

    torch.testing.assert_close(run(moved)[:, :, :-1], run(v)[:, :, :-1], atol=0, rtol=0)
    assert not torch.equal(run(moved)[:, :, -1], run(v)[:, :, -1])

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


def test_a_paths_conditions_are_asked_with_the_normalizer_and_only_keeps_its_own_serves():
    """`when` (a condition on the normalizer, e.g. Sinkhorn's one round) and `only` (on the call,
    e.g. padded) narrow a path built at test time: each predicate is asked with the normalizer of
    the call, in order, and `only` adds its condition to the path's own `serves`, never drops it."""
    from attnlab.attention.functional import normalizer
    from attnlab.attention.paths import FastPath, choose

    asked = []

    def supports(norm, device, dtype, dropout_p, causal):
        asked.append(("supports", norm, device, dtype, dropout_p, causal))
        return True

    def serves(norm, call):  # the path's own: fewer than 5 queries
        asked.append(("serves", norm))
        return call.q.shape[-2] < 5

    def run(norm, call):
        asked.append(("run", norm))
        return call.v

    def one_round(norm):
        asked.append(("when", norm))
        return norm.options.n_iter == 1

    def padded(norm, call):
        asked.append(("only", norm))
        return call.padded

    path = FastPath("mine", supports, run, serves).when(one_round).only(padded)
    assert path.name == "mine" and path.run is run
    one, _ = normalizer("sinkhorn", n_iter=1)
    three, _ = normalizer("sinkhorn", n_iter=3)
    q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
    mask = torch.zeros(1, 4, dtype=torch.bool)
    call = one.call(q, k, v, mask)
    assert path.accepts(one, call)
    assert asked == [("when", one), ("supports", one, "cpu", torch.float32, 0.0, False),
                     ("only", one), ("serves", one)]
    asked.clear()
    assert torch.equal(path(one, call), v) and asked == [("run", one)]
    asked.clear()
    assert not path.accepts(three, three.call(q, k, v, mask))  # the normalizer's condition
    assert asked == [("when", three)]
    assert not path.accepts(one, one.call(q, k, v))  # the call's condition
    long = [torch.randn(1, 2, 6, 8) for _ in range(3)]
    assert not path.accepts(one, one.call(*long, torch.zeros(1, 6, dtype=torch.bool)))  # its own serves
    assert choose((path,), one, one.call(*long, torch.zeros(1, 6, dtype=torch.bool))) is None


@pytest.mark.parametrize("backend", ["fused_cpu", "composed"])
def test_hnas_takes_u_in_another_float_dtype_than_the_queries(backend, monkeypatch):
    """A float64 u given with float32 q, k, v reaches the CPU kernels in the working dtype: the
    output of the same u in float32 (the composed path's lerp takes one dtype only)."""
    if backend == "composed":  # no C++ compiler: DNAS / HNAS on ATen's flash kernel
        monkeypatch.setattr(fused, "load", lambda: False)
    (q, k, v), kpm, qpm, _ = _problem("hnas", torch.float32, seed=9)
    u = torch.tensor([0.3, 0.7], dtype=torch.float64).view(1, 2, 1, 1)
    assert route(q, k, v, "hnas", kpm, qpm, u=u) == backend
    out = attend(q, k, v, "hnas", kpm, qpm, u=u)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, attend(q, k, v, "hnas", kpm, qpm, u=u.float()), atol=0, rtol=0)


def test_stickbreaking_runs_by_blocks_only_past_one_block():
    """Exactly MIN_PAIRS (query, key) pairs is one block: the reference runs it; one more key and
    the blocked kernel does."""
    from attnlab.attention.kernels import stickbreaking as blocked

    assert blocked.MIN_PAIRS == 128 * 128
    q = torch.randn(1, 1, 128, 4)
    for s_k, expected in ((128, "reference"), (129, "blocked")):
        k = v = torch.randn(1, 1, s_k, 4)
        assert route(q, k, v, "stickbreaking", causal=True) == expected, s_k

"""The CPU fast paths of the row-wise schemes (sigmoid, sink, softpick on the fused row-wise
kernel; SSMax on the UNAS paths with scaled queries; UNAS, whose value here is narrower than its
query, on the row-wise kernel's softmax) against a float64 materialized reference
written here from the formulas, and against each scheme's own `weights`: outputs and gradients
of q, k, v and the scheme's parameter, under key / query padding, rows without any valid key,
rows of one valid key, S = 1, causal masks and dropout; and the routes."""

from __future__ import annotations

import math
import zlib

import pytest
import torch

from attnlab.attention import paths
from attnlab.attention.kernels import fused, rowwise
from attnlab.attention.schemes import sigmoid, sink, softpick, ssmax, unas
from attnlab.attention.schemes.sigmoid import Sigmoid, SigmoidOptions
from attnlab.attention.schemes.sink import Sink, SinkOptions
from attnlab.attention.schemes.softpick import Softpick, SoftpickOptions
from attnlab.attention.schemes.ssmax import SSMax, SSMaxOptions
from attnlab.attention.schemes.unas import UNAS

pytestmark = pytest.mark.skipif(not fused.load(), reason="the fused CPU kernel did not build")

F32, F64 = torch.float32, torch.float64
H = 3


# ----------------------------------------------------------------------------- the reference
def _logits(q, k, kpm, qpm, causal):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    valid = torch.ones(s.shape, dtype=torch.bool)
    if kpm is not None:
        valid = valid & ~kpm[:, None, None, :]
    if qpm is not None:
        valid = valid & ~qpm[:, None, :, None]
    if causal:
        valid = valid & torch.ones(s.shape[-2:], dtype=torch.bool).tril()
    return s, valid


def reference_weights(kind, q, k, kpm=None, qpm=None, causal=False, param=None, bias="log_n",
                      eps=1e-8):
    """The formulas, in float64, masked pairs excluded, a row without valid keys all 0."""
    s, valid = _logits(q, k, kpm, qpm, causal)
    zero = torch.zeros_like(s)
    s0 = torch.where(valid, s, zero)
    n = valid.sum(-1, keepdim=True).clamp(min=1).to(s.dtype)
    if kind == "sigmoid":
        beta = {"log_n": -torch.log(n), "learned": param, "zero": 0.0}[bias]
        return torch.where(valid, torch.sigmoid(s0 + beta), zero)
    if kind == "sink":  # exp(s) / (exp(b) + sum exp(s)): the sink as one more column
        logit = torch.where(valid, s, torch.full_like(s, -math.inf))
        sink = param.expand(*s.shape[:-1], 1)
        r = torch.logsumexp(torch.cat([logit, sink], -1), -1, keepdim=True)
        return torch.where(valid, torch.exp(s0 - r), zero)
    if kind == "softpick":  # the authors' shifted form, shift c = max(row max, 0)
        m = torch.where(valid, s, torch.full_like(s, -math.inf)).amax(-1, keepdim=True)
        c = torch.where(torch.isfinite(m), m, torch.zeros_like(m)).clamp(min=0)
        a = torch.exp(s0 - c) - torch.exp(-c)
        num = torch.where(valid, torch.relu(a), zero)
        return num / (torch.where(valid, a.abs(), zero).sum(-1, keepdim=True) + eps)
    # ssmax: softmax over the valid keys of s * c * log n; unas: of s
    scaled = s0 if kind == "unas" else s0 * param * torch.log(n)
    x = torch.where(valid, scaled, torch.full_like(s, -math.inf))
    m = x.detach().amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.where(valid, torch.exp(x - m), zero)
    total = e.sum(-1, keepdim=True)
    return e / torch.where(total > 0, total, torch.ones_like(total))


# ----------------------------------------------------------------------------- cases
SCHEMES = {
    "sigmoid": lambda: Sigmoid(SigmoidOptions(bias="log_n")),
    "sigmoid_learned": lambda: Sigmoid(SigmoidOptions(bias="learned")),
    "sigmoid_zero": lambda: Sigmoid(SigmoidOptions(bias="zero")),
    "sink": lambda: Sink(SinkOptions()),
    "softpick": lambda: Softpick(SoftpickOptions()),
    "softpick_eps": lambda: Softpick(SoftpickOptions(eps=0.3)),  # eps visible: grad through max
    "ssmax": lambda: SSMax(SSMaxOptions()),
    "unas": UNAS,
}
# each scheme's CPU fast paths (SSMax: UNAS's, on scaled queries)
CPU_PATHS = {"sigmoid": sigmoid.PATHS[:1], "sink": sink.PATHS[:1], "softpick": softpick.PATHS,
             "ssmax": ssmax.PATHS[:-1], "unas": unas.PATHS}


class CpuPath:
    """Runs the scheme's CPU fast path that accepts the call (failing where none does)."""

    def __init__(self, kind):
        self.paths = CPU_PATHS[kind]

    def __call__(self, norm, call):
        path = paths.choose(self.paths, norm, call)
        assert path is not None, "no CPU fast path accepts the call"
        return path(norm, call)


FAST = {kind: CpuPath(kind) for kind in CPU_PATHS}


def kind_of(name):
    return name.split("_")[0]


def param_of(name, dtype):
    """The scheme's parameter as a (1, H, 1, 1) leaf, or None."""
    values = {"sigmoid_learned": [-1.5, 0.3, -4.0], "sink": [0.5, -2.0, 3.0],
              "ssmax": [0.43, 1.2, -0.3]}.get(name)
    return None if values is None else torch.tensor(values, dtype=dtype).view(1, H, 1, 1).requires_grad_()


def masks(case, B, S):
    kpm = qpm = None
    if case in ("padded", "padded_causal"):
        kpm = torch.zeros(B, S, dtype=torch.bool)
        kpm[1, S // 2:] = True  # item 1: half its keys padded
        kpm[2, :] = True  # item 2: no valid key at all (rows all 0)
        kpm[3, 1:] = True  # item 3: one valid key
        qpm = torch.zeros(B, S, dtype=torch.bool)
        qpm[1, S - 3:] = True
        qpm[0, 2] = True
    return kpm, qpm


def problem(B, S, d, dv, dtype, seed=0, scale=1.5):
    g = torch.Generator().manual_seed(seed)
    q, k = (scale * torch.randn(B, H, S, d, generator=g, dtype=F64) for _ in range(2))
    v = torch.randn(B, H, S, dv, generator=g, dtype=F64)
    gout = torch.randn(B, H, S, dv, generator=g, dtype=F64)
    return q, k, v, gout


def run(fn, q, k, v, param, gout):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    p = None if param is None else param.detach().clone().requires_grad_()
    out = fn(*leaves, p)
    grads = torch.autograd.grad((out * gout.to(out.dtype)).sum(), [*leaves, *([p] if p is not None else [])])
    return out.detach(), [gr.detach() for gr in grads]


def check(a, b, dtype, what):
    # float32 against float64: loose enough for the float32 rounding of ill-conditioned rows
    # (softpick with one valid key of a small positive score: ds ~ dP (1 - w) / a, cancelling;
    # SSMax's dc, a sum over every score); float64 is exact to rounding
    atol, rtol = (1e-9, 1e-8) if dtype == F64 else (3e-4, 1e-3)
    torch.testing.assert_close(a.to(F64), b.to(F64), atol=atol, rtol=rtol, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("case", ["plain", "padded", "causal", "padded_causal", "single"])
@pytest.mark.parametrize("name", list(SCHEMES))
def test_fast_path_matches_reference(name, case, dtype):
    kind = kind_of(name)
    norm = SCHEMES[name]()
    B, S, d, dv = (2, 1, 8, 8) if case == "single" else (4, 37, 16, 12)
    q, k, v, gout = problem(B, S, d, dv, F64, seed=zlib.crc32(f"{name}/{case}".encode()) % 1000)
    kpm, qpm = masks(case, B, S)
    causal = "causal" in case
    param = param_of(name, F64)
    pname = {"sigmoid": "b", "sink": "b", "ssmax": "c"}.get(kind)

    def fast(q_, k_, v_, p_):
        inputs = {} if p_ is None else {pname: p_}
        call = norm.call(q_.to(dtype), k_.to(dtype), v_.to(dtype), kpm, qpm, causal, **inputs)
        out = FAST[kind](norm, call)
        assert out is not None, "the fast path declined"
        return out

    def ours(q_, k_, v_, p_):
        opts = norm.options
        w = reference_weights(kind, q_, k_, kpm, qpm, causal, p_, bias=getattr(opts, "bias", None),
                              eps=getattr(opts, "eps", 0.0))
        return w @ v_

    def scheme(q_, k_, v_, p_):  # the scheme's own materialized reference, float64
        inputs = {} if p_ is None else {pname: p_}
        return norm.reference(norm.call(q_, k_, v_, kpm, qpm, causal, **inputs))

    out, grads = run(fast, q, k, v, param, gout)
    ref_out, ref_grads = run(ours, q, k, v, param, gout)
    sch_out, sch_grads = run(scheme, q, k, v, param, gout)
    assert torch.isfinite(out).all() and all(torch.isfinite(gr).all() for gr in grads)
    check(sch_out, ref_out, F64, "scheme weights vs formulas")
    check(out, ref_out, dtype, "out")
    names = ["dq", "dk", "dv", "dparam"]
    for n, a, b, c in zip(names, grads, ref_grads, sch_grads):
        check(c, b, F64, f"scheme {n} vs formulas")
        check(a, b, dtype, n)
    if case == "padded":  # rows without any valid key and padded queries: exactly 0
        assert out[2].abs().max() == 0 and out[1, :, S - 3:].abs().max() == 0


@pytest.mark.parametrize("name", ["sigmoid_learned", "sink", "softpick", "ssmax"])
def test_dropout_matches_reference(name):
    """The same torch seed drops the same weights on the fast path and the reference."""
    kind = kind_of(name)
    norm = SCHEMES[name]()
    q, k, v, gout = problem(2, 29, 16, 16, F64, seed=3)
    kpm, qpm = masks("padded", 4, 29)
    kpm, qpm = kpm[:2], qpm[:2]
    param = param_of(name, F64)
    pname = {"sigmoid": "b", "sink": "b", "ssmax": "c"}.get(kind)

    def with_path(path):
        def fn(q_, k_, v_, p_):
            torch.manual_seed(7)
            call = norm.call(q_, k_, v_, kpm, qpm, False, 0.2, **({pname: p_} if p_ is not None else {}))
            out = path(norm, call) if path else norm.reference(call)
            assert out is not None
            return out
        return fn

    out, grads = run(with_path(FAST[kind]), q, k, v, param, gout)
    ref, ref_grads = run(with_path(None), q, k, v, param, gout)
    check(out, ref, F64, "out")
    for a, b in zip(grads, ref_grads):
        check(a, b, F64, "grad")


def test_scheme_float32_weights_agree():
    """The fast paths in float32 against each scheme's float32 reference at moderate S."""
    q, k, v, _ = problem(2, 200, 32, 32, F32, seed=5, scale=2.0)
    kpm, _ = masks("padded", 4, 200)
    for name, make in SCHEMES.items():
        kind = kind_of(name)
        norm = make()
        param = param_of(name, F32)
        inputs = {} if param is None else {{"ssmax": "c"}.get(kind, "b"): param.detach()}
        call = norm.call(q.float(), k.float(), v.float(), kpm[:2], None, False, **inputs)
        check(FAST[kind](norm, call), norm.reference(call), F32, name)


@pytest.mark.parametrize("name", list(SCHEMES))
def test_route_lists_the_cpu_path(name):
    norm = SCHEMES[name]()
    # SSMax: UNAS's paths on scaled queries; with causal dropout, which ATen's flash kernel does
    # not take, the row-wise kernel's softmax (for a value wider than the query only)
    expected = {"ssmax": "scaled_sdpa", "unas": "sdpa"}.get(kind_of(name), "fused_cpu")
    dropped = {"ssmax": "scaled_rowwise_cpu", "unas": "rowwise_cpu"}.get(kind_of(name), expected)
    assert norm.candidates("cpu", F32)[0] == expected
    assert norm.candidates("cpu", F64, 0.1, True)[0] == dropped
    assert norm.candidates("cuda", torch.bfloat16)[0] != dropped  # (SDPA serves UNAS on both)


def test_valid_keys_counts():
    kpm = torch.tensor([[False, True, False, False], [True, True, True, True]])
    n = rowwise.valid_keys(kpm, False, 3, 4, torch.device("cpu"))
    assert n.shape == (2, 1, 3, 1) and n[0].flatten().tolist() == [3.0] * 3 and n[1].sum() == 0
    n = rowwise.valid_keys(kpm, True, 5, 4, torch.device("cpu"))
    assert n[0].flatten().tolist() == [1.0, 1.0, 2.0, 3.0, 3.0]
    n = rowwise.valid_keys(None, True, 3, 2, torch.device("cpu"))
    assert n.flatten().tolist() == [1.0, 2.0, 2.0]


def test_no_nan_for_large_and_negative_scores():
    """Scores around -+1e3 (exp would overflow without the shifts): finite everywhere."""
    q, k, v, gout = problem(1, 16, 8, 8, F32, seed=2, scale=40.0)
    for name, make in SCHEMES.items():
        kind = kind_of(name)
        norm = make()
        param = param_of(name, F32)

        def fast(q_, k_, v_, p_, kind=kind, norm=norm):
            inputs = {} if p_ is None else {{"ssmax": "c"}.get(kind, "b"): p_}
            return FAST[kind](norm, norm.call(q_.float(), k_.float(), v_.float(), **inputs))

        out, grads = run(fast, q, k, v, param, gout)
        assert torch.isfinite(out).all() and all(torch.isfinite(gr).all() for gr in grads), name


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", list(SCHEMES))
def test_cross_attention_lengths(name, causal):
    """S_q != S_k (top-left causal alignment), d != d_v, key and query padding, float64."""
    kind = kind_of(name)
    norm = SCHEMES[name]()
    g = torch.Generator().manual_seed(11)
    q = 1.5 * torch.randn(2, H, 7, 8, generator=g, dtype=F64)
    k = 1.5 * torch.randn(2, H, 12, 8, generator=g, dtype=F64)
    v, gout = torch.randn(2, H, 12, 5, generator=g, dtype=F64), torch.randn(2, H, 7, 5, generator=g, dtype=F64)
    kpm = torch.zeros(2, 12, dtype=torch.bool)
    kpm[1, 4:] = True
    qpm = torch.zeros(2, 7, dtype=torch.bool)
    qpm[1, 5:] = True
    param = param_of(name, F64)
    pname = {"sigmoid": "b", "sink": "b", "ssmax": "c"}.get(kind)

    def make(path):
        def fn(q_, k_, v_, p_):
            call = norm.call(q_, k_, v_, kpm, qpm, causal, **({pname: p_} if p_ is not None else {}))
            return path(norm, call) if path else norm.reference(call)
        return fn

    out, grads = run(make(FAST[kind]), q, k, v, param, gout)
    ref, ref_grads = run(make(None), q, k, v, param, gout)
    check(out, ref, F64, "out")
    for a, b in zip(grads, ref_grads):
        check(a, b, F64, "grad")


def test_ssmax_runs_a_unas_path_on_queries_scaled_by_c_log_n_on_the_cpu_only():
    """`ssmax.scaled(path)` (a path built at test time): named scaled_<its name>, on the CPU only
    and where the path supports the call; its `serves` (if it has one) and its `run` are given the
    SSMax normalizer and q_i * c log(n_i), n_i the row's valid keys."""
    from attnlab.attention.paths import FastPath

    asked = []

    def supports(norm, device, dtype, dropout_p, causal):
        asked.append(("supports", norm, device, dtype, dropout_p, causal))
        return dropout_p == 0.0

    def serves(norm, call):
        asked.append(("serves", norm, call.q))
        return True

    def run(norm, call):
        asked.append(("run", norm, call.q))
        return call.v

    path = ssmax.scaled(FastPath("spy", supports, run, serves))
    plain = ssmax.scaled(FastPath("plain", supports, run))
    assert (path.name, plain.name, plain.serves) == ("scaled_spy", "scaled_plain", None)
    norm = SSMax(SSMaxOptions(scale_init=0.7))
    g = torch.Generator().manual_seed(21)
    q, k, v = (torch.randn(2, H, 4, 8, generator=g) for _ in range(3))
    kpm = torch.tensor([[False, False, True, False], [False] * 4])
    call = norm.call(q, k, v, kpm)
    scaled = q * 0.7 * torch.log(torch.tensor([3.0, 4.0])).view(2, 1, 1, 1)  # 3 and 4 valid keys
    assert path.accepts(norm, call)
    (supported, served) = asked
    assert supported == ("supports", norm, "cpu", F32, 0.0, False)
    assert served[:2] == ("serves", norm) and torch.allclose(served[2], scaled, atol=1e-6, rtol=0)
    asked.clear()
    assert torch.equal(path(norm, call), v)
    ((ran, ran_norm, ran_q),) = asked
    assert (ran, ran_norm) == ("run", norm) and torch.allclose(ran_q, scaled, atol=1e-6, rtol=0)
    assert plain.accepts(norm, call)
    assert not path.supports(norm, "cuda", F32, 0.0, False)  # the CPU only
    assert not path.supports(norm, "cpu", F32, 0.1, False)  # and what the path supports


def test_ssmax_leaves_flash_where_its_scaled_scores_could_overflow_it():
    """SSMax's scaled_sdpa asks flash's bound of the scaled queries (c log n = 0.43 log 256 ~ 2.4
    times q): huge scores run on the fused kernel, finite with their gradients; scores under the
    bound only unscaled too; ordinary ones stay on flash."""
    from attnlab.attention import attend
    from attnlab.attention.functional import route
    from attnlab.attention.kernels import sdpa

    g = torch.Generator().manual_seed(22)
    q, k = (torch.randn(1, 2, 256, 8, generator=g) * 1e4 for _ in range(2))
    v = torch.randn(1, 2, 256, 8, generator=g)
    assert route(q, k, v, "ssmax") == "scaled_fused_cpu"
    q.requires_grad_()
    out = attend(q, k, v, "ssmax")
    out.square().sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(q.grad).all()
    assert route(q.detach() / 1e3, k / 1e3, v, "ssmax") == "scaled_sdpa"
    edge = (0.6 * sdpa.SAFE_SCORE_BOUND / math.sqrt(8)) ** 0.5  # max|q| max|k| sqrt(d) = 0.6 bound
    flat = torch.full((1, 2, 256, 8), edge)
    assert route(flat, flat, v, "unas") == "sdpa" and route(flat, flat, v, "ssmax") == "scaled_fused_cpu"

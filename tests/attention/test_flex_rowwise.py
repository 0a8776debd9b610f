"""FlexAttention paths of sigmoid, sink and SSMax (kernels/flex_rowwise.py): eager FlexAttention
on the CPU against the float64 reference, forward with padding (fully padded rows included),
causal, lengths across the 128-blocks; gradients (q, k, v and the scheme's parameter, through
the returned LSE for sink and sigmoid) with FlexAttention's eager math backward, which PyTorch
refuses on the CPU by a device check that these tests lift; which calls the paths serve; on a
GPU (`gpu` marker) compiled forward and backward."""

from __future__ import annotations

import pytest
import torch
from helpers.kernel_cases import leaf, out_and_grads, padded_problem

from attnlab.attention import attend, paths, reference_attend
from attnlab.attention.functional import candidates, normalizer
from attnlab.attention.kernels import flex, flex_rowwise
from attnlab.attention.schemes import sink

pytestmark = pytest.mark.usefixtures("one_thread")
no_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
F32, BF16 = torch.float32, torch.bfloat16
H = 2
PARAM = torch.tensor([0.6, -1.2]).view(1, H, 1, 1)
# (id, scheme, options, the per-head input or None)
CASES = [
    ("sigmoid-log_n", "sigmoid", {"bias": "log_n"}, None),
    ("sigmoid-learned", "sigmoid", {"bias": "learned"}, "b"),
    ("sigmoid-zero", "sigmoid", {"bias": "zero"}, None),
    ("sink", "sink", {}, "b"),
    ("ssmax", "ssmax", {}, "c"),
]
IDS = [c[0] for c in CASES]


def _flex(q, k, v, scheme, options, param, kpm, qpm, causal):
    if scheme == "sigmoid":
        return flex_rowwise.sigmoid_attend_flex(q, k, v, options["bias"], param, kpm, qpm, causal)
    fn = flex_rowwise.sink_attend_flex if scheme == "sink" else flex_rowwise.ssmax_attend_flex
    return fn(q, k, v, param, kpm, qpm, causal)


def _reference(q, k, v, scheme, options, name, param, kpm, qpm, causal):
    inputs = {name: param.double()} if name else {}
    return reference_attend(q.double(), k.double(), v.double(), scheme, kpm, qpm, causal,
                            **options, **inputs)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(("S_q", "S_k", "d"), [(6, 5, 16), (130, 200, 16), (1, 1, 16), (140, 140, 8)])
@pytest.mark.parametrize(("case", "scheme", "options", "name"), CASES, ids=IDS)
def test_flex_forward_matches_the_reference(case, scheme, options, name, S_q, S_k, d, causal):
    q, k, v, _, kpm, qpm = padded_problem(S_q, S_k, d, H=H, seed=S_q + S_k)
    out = _flex(q, k, v, scheme, options, PARAM, kpm, qpm, causal)
    ref = _reference(q, k, v, scheme, options, name, PARAM, kpm, qpm, causal)
    assert out.dtype == F32 and torch.isfinite(out).all()
    # sigmoid rows hold up to n/2 of mass: the error scales with the output
    torch.testing.assert_close(out.double(), ref, atol=2e-6 * max(1.0, ref.abs().max().item()), rtol=1e-5)
    assert (out[2] == 0).all() and (out[3] == 0).all() and (out[0][:, qpm[0]] == 0).all()


def test_valid_keys_counts_each_rows_keys():
    kpm = torch.tensor([[False, True, False, False], [True, True, True, True]])
    qpm = torch.tensor([[False, False, True, False, False], [False] * 5])
    n = flex_rowwise.valid_keys(2, 5, 4, "cpu", kpm, qpm, causal=True)
    assert n.tolist() == [[1, 1, 0, 3, 3], [0, 0, 0, 0, 0]]
    assert flex_rowwise.valid_keys(2, 5, 4, "cpu", kpm, None).tolist() == [[3] * 5, [0] * 5]


@pytest.fixture
def cpu_backward(monkeypatch):
    """FlexAttention's eager math backward on the CPU: PyTorch only refuses it by a device check."""
    import torch.nn.attention.flex_attention as fa

    if not hasattr(fa, "_validate_device"):
        pytest.skip("this torch has no _validate_device to lift")
    real = fa._validate_device
    monkeypatch.setattr(fa, "_validate_device",
                        lambda q, k, v: real(*(t.detach() for t in (q, k, v))))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(("case", "scheme", "options", "name"), CASES, ids=IDS)
def test_flex_gradients_match_the_reference(case, scheme, options, name, causal, cpu_backward):
    """dq, dk, dv and d(parameter): the sink's and sigmoid's through FlexAttention's LSE."""
    q, k, v, _, kpm, qpm = padded_problem(20, 24, 16, H=H, seed=3)
    g_out = torch.randn(4, H, 20, 16, generator=torch.Generator().manual_seed(1))
    tensors = leaf(q, k, v, PARAM)
    wrt = tensors if name else tensors[:3]
    got = out_and_grads(lambda: _flex(*tensors[:3], scheme, options, tensors[3], kpm, qpm, causal),
                        wrt, g_out)
    ref_in = leaf(q, k, v, PARAM, dtype=torch.float64)
    ref_wrt = ref_in if name else ref_in[:3]
    ref = out_and_grads(lambda: _reference(*ref_in[:3], scheme, options, name, ref_in[3], kpm, qpm,
                                           causal), ref_wrt, g_out)
    for what, a, b in zip(("out", "dq", "dk", "dv", "dparam"), got, ref):
        assert torch.isfinite(a).all(), what
        torch.testing.assert_close(a.double(), b, atol=2e-5, rtol=1e-4, msg=what)


# ----------------------------------------------------------------------------- the paths
@pytest.fixture
def as_cuda(monkeypatch):
    """CPU tensors routed as CUDA ones; records the flex calls (eager on the CPU)."""
    ran = []
    monkeypatch.setattr(paths, "device_type", lambda t: "cuda")
    for fn in ("sigmoid_attend_flex", "sink_attend_flex", "ssmax_attend_flex"):
        real = getattr(flex_rowwise, fn)

        def spy(*args, _real=real, _fn=fn, **kwargs):
            ran.append(_fn)
            return _real(*args, **kwargs)

        monkeypatch.setattr(flex_rowwise, fn, spy)
    return ran


@pytest.mark.parametrize(("case", "scheme", "options", "name"), CASES, ids=IDS)
def test_attend_runs_flex_on_cuda_without_dropout(case, scheme, options, name, as_cuda):
    for causal in (False, True):
        assert candidates(scheme, "cuda", BF16, causal=causal, **options)[-2:] == ["flex", "reference"]
        assert "flex" not in candidates(scheme, "cuda", BF16, 0.1, **options)
        assert "flex" not in candidates(scheme, "cuda", torch.float64, **options)
        assert "flex" not in candidates(scheme, "cpu", F32, **options)
    q, k, v, _, kpm, qpm = padded_problem(20, 24, 16, H=H, seed=5)
    inputs = {name: PARAM} if name else {}
    out = attend(q, k, v, scheme, kpm, qpm, True, **options, **inputs)
    assert as_cuda == [f"{scheme}_attend_flex"]
    ref = _reference(q, k, v, scheme, options, name, PARAM, kpm, qpm, True)
    torch.testing.assert_close(out.double(), ref, atol=3e-6, rtol=1e-5)


def test_a_modules_parameter_reaches_the_flex_path(as_cuda):
    q, k, v, _, kpm, qpm = padded_problem(9, 9, 16, H=H, seed=6)
    for scheme, name in (("sink", "b"), ("ssmax", "c")):
        norm, _ = normalizer(scheme)
        module = type(norm)(norm.options, num_heads=H)
        with torch.no_grad():
            next(module.parameters()).copy_(PARAM.view(H))
            out = module(q, k, v, kpm, qpm)
        ref = _reference(q, k, v, scheme, {}, name, PARAM, kpm, qpm, False)
        torch.testing.assert_close(out.double(), ref, atol=3e-6, rtol=1e-5)
    assert as_cuda == ["sink_attend_flex", "ssmax_attend_flex"]


def test_flex_declines_head_dims_past_its_limit(as_cuda):
    d = flex.MAX_HEAD_DIM + 4
    q, k, v, _, _, _ = padded_problem(3, 4, d, B=1, seed=7)
    norm, _ = normalizer("sink")
    assert not sink.PATHS[-1].accepts(norm, norm.call(q, k, v)) and as_cuda == []


# ----------------------------------------------------------------------------- on a GPU
@pytest.mark.parametrize("dtype", [BF16, F32], ids=["bf16", "fp32"])  # gpu-check: "not fp32"
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(("case", "scheme", "options", "name"), CASES, ids=IDS)
@pytest.mark.gpu
@no_cuda
def test_compiled_flex_forward_and_backward_on_a_gpu(case, scheme, options, name, causal, dtype):
    """Compiled kernels against float64, within a few times SDPA's own error in the dtype."""
    S, d = 300, 64
    q, k, v, _, kpm, qpm = padded_problem(S, S, d, H=H, seed=S)
    g_out = torch.randn(4, H, S, d, generator=torch.Generator().manual_seed(1)).cuda()
    kpm, qpm = kpm.cuda(), qpm.cuda()
    tensors = leaf(*(t.cuda() for t in (q, k, v)), dtype=dtype) + leaf(PARAM.cuda())
    wrt = tensors if name else tensors[:3]
    got = out_and_grads(lambda: _flex(*tensors[:3], scheme, options, tensors[3], kpm, qpm, causal),
                        wrt, g_out)
    ref_in = leaf(*tensors, dtype=torch.float64)
    ref = out_and_grads(lambda: _reference(*ref_in[:3], scheme, options, name, ref_in[3], kpm, qpm,
                                           causal), ref_in if name else ref_in[:3], g_out)
    eps = max(torch.finfo(dtype).eps, 1e-6)
    for what, a, b in zip(("out", "dq", "dk", "dv", "dparam"), got, ref):
        err = (a.double() - b).abs().max().item()
        assert err <= 64 * eps * max(1.0, b.abs().max().item()), (what, err)

"""The row-wise schemes whose rows need not sum to one (sigmoid, sink) and SSMax: their
references in float32 against float64 (values and gradients, the scheme's parameter included)
under every kind of mask, their defining identities, parity with independent re-statements of
the authors' reference code, their parameters in a module (found, reported, trained) and their
options' errors."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.kernel_cases import padded_problem

from attnlab.attention import (
    AttentionSpec,
    MultiHeadAttention,
    attention_weights,
    reference_attend,
    scheme_parameters,
    scheme_values,
)
from attnlab.attention.reference import masked_logits
from attnlab.attention.schemes import NORMALIZERS
from attnlab.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_thread")
F64 = torch.float64
H = 2
PARAM = torch.tensor([0.7, -1.3]).view(1, H, 1, 1)  # b or c, one per head
# (id, scheme, options, the name of its per-head input or None)
CASES = [
    ("sigmoid-log_n", "sigmoid", {"bias": "log_n"}, None),
    ("sigmoid-learned", "sigmoid", {"bias": "learned"}, "b"),
    ("sigmoid-zero", "sigmoid", {"bias": "zero"}, None),
    ("sink", "sink", {}, "b"),
    ("sink-fixed", "sink", {"learned": False}, None),
    ("ssmax", "ssmax", {}, "c"),
]
IDS = [c[0] for c in CASES]


def _out_and_grads(q, k, v, scheme, options, name, kpm, qpm, causal, param, g_out):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, param)]
    inputs = {name: leaves[3]} if name else {}
    out = reference_attend(*leaves[:3], scheme, kpm, qpm, causal, **options, **inputs)
    grads = torch.autograd.grad((out.double() * g_out).sum(), leaves[:3] + leaves[3:] * bool(name))
    return (out, *grads)


def _problems():
    """(S_q, S_k, d, seed) of padded_problem (partial padding, none, every key padded, every
    query padded), plus S = 1."""
    return [(6, 5, 8, 0), (5, 9, 4, 1), (1, 1, 8, 2), (7, 7, 8, 3)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(("S_q", "S_k", "d", "seed"), _problems())
@pytest.mark.parametrize(("case", "scheme", "options", "name"), CASES, ids=IDS)
def test_float32_reference_matches_float64_values_and_gradients(case, scheme, options, name, S_q,
                                                                S_k, d, seed, causal):
    q, k, v, _, kpm, qpm = padded_problem(S_q, S_k, d, H=H, seed=seed, scale=2.0)
    g_out = torch.randn(4, H, S_q, d, generator=torch.Generator().manual_seed(seed), dtype=F64)
    got = _out_and_grads(q, k, v, scheme, options, name, kpm, qpm, causal, PARAM, g_out)
    ref = _out_and_grads(q.double(), k.double(), v.double(), scheme, options, name, kpm, qpm,
                         causal, PARAM.double(), g_out)
    assert got[0].dtype == torch.float32
    for a, b in zip(got, ref):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a.double(), b, atol=2e-5, rtol=1e-5)
    out = got[0]
    assert (out[2] == 0).all() and (out[3] == 0).all()  # no valid key / every query padded
    assert (out[0][:, qpm[0]] == 0).all()
    # padded keys get weight 0 exactly, padded queries whole rows of 0
    inputs = {name: PARAM} if name else {}
    w = attention_weights(q, k, scheme, kpm, qpm, causal, **options, **inputs)
    valid = ~(kpm[:, None, None, :] | qpm[:, None, :, None])
    if causal:
        valid = valid & torch.ones(S_q, S_k, dtype=torch.bool).tril()
    assert (w[~valid.expand_as(w)] == 0).all() and torch.isfinite(w).all() and (w >= 0).all()


@pytest.mark.parametrize(("case", "scheme", "options", "name"), CASES, ids=IDS)
def test_one_valid_key(case, scheme, options, name):
    """One valid key per row: sigmoid(s + b) (log_n: n = 1, b = 0), the sink's sigmoid(s - b),
    SSMax's 1 (log 1 = 0: a softmax of one element); finite gradients."""
    q, k, _, _, _, _ = padded_problem(3, 4, 8, B=2, H=H, seed=4)
    q.requires_grad_()
    kpm = torch.tensor([[True, False, True, True], [False, True, True, True]])
    param = PARAM.clone().requires_grad_()
    inputs = {name: param} if name else {}
    w = attention_weights(q, k, scheme, kpm, None, False, **options, **inputs)
    s = masked_logits(q, k, kpm).detach()
    s_valid = torch.stack([s[0, :, :, 1], s[1, :, :, 0]])  # (B, H, S_q)
    w_valid = torch.stack([w[0, :, :, 1], w[1, :, :, 0]]).detach()
    b = PARAM[..., 0]
    expected = {
        "sigmoid-log_n": torch.sigmoid(s_valid), "sigmoid-learned": torch.sigmoid(s_valid + b),
        "sigmoid-zero": torch.sigmoid(s_valid), "sink": torch.sigmoid(s_valid - b),
        "sink-fixed": torch.sigmoid(s_valid), "ssmax": torch.ones_like(s_valid),
    }[case]
    torch.testing.assert_close(w_valid, expected, atol=1e-6, rtol=1e-6)
    assert w.sum().item() == pytest.approx(w_valid.sum().item(), abs=1e-5)  # all else 0
    w.sum().backward()
    assert torch.isfinite(q.grad).all() and (param.grad is None or torch.isfinite(param.grad).all())


def _valid(S_q, S_k, kpm, qpm, causal):
    valid = ~(kpm[:, None, None, :] | qpm[:, None, :, None])
    if causal:
        valid = valid & torch.ones(S_q, S_k, dtype=torch.bool).tril()
    return valid  # (B, 1, S_q, S_k)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_the_sinks_missing_mass_is_the_sink_weight(causal):
    """1 - sum_j w_ij = exp(b) / (exp(b) + sum_j exp(s_ij)) over the row's valid keys, < 1 for
    every row with a valid key (a row without one: all 0)."""
    q, k, _, _, kpm, qpm = padded_problem(6, 7, 8, H=H, seed=5, dtype=F64)
    w = attention_weights(q, k, "sink", kpm, qpm, causal, b=PARAM.double())
    s = masked_logits(q, k, kpm, qpm, causal)
    sums = torch.where(torch.isfinite(s), s.exp(), torch.zeros_like(s)).sum(-1)
    b = PARAM.double()[..., 0]
    live = _valid(6, 7, kpm, qpm, causal).any(-1).expand_as(sums)
    torch.testing.assert_close((1 - w.sum(-1))[live], (b.exp() / (b.exp() + sums))[live],
                               atol=1e-12, rtol=0)
    assert (w.sum(-1)[live] < 1).all() and (w.sum(-1)[~live] == 0).all()


def test_sigmoid_rows_are_not_normalized_and_ssmax_rows_are():
    q, k, _, _, kpm, qpm = padded_problem(6, 7, 8, H=H, seed=6, dtype=F64, scale=2.0)
    live = _valid(6, 7, kpm, qpm, False).any(-1).expand(4, H, 6)
    s = masked_logits(q, k, kpm, qpm)
    for bias, b in (("log_n", None), ("zero", 0.0)):
        w = attention_weights(q, k, "sigmoid", kpm, qpm, bias=bias)
        n = torch.isfinite(s).sum(-1, keepdim=True).clamp(min=1)
        shift = -torch.log(n.double()) if b is None else b
        by_hand = torch.where(torch.isfinite(s), torch.sigmoid(s + shift), torch.zeros_like(s))
        torch.testing.assert_close(w, by_hand, atol=1e-12, rtol=0)
        assert (w.sum(-1)[live] - 1).abs().max() > 0.1  # rows far from summing to 1
    rows = attention_weights(q, k, "ssmax", kpm, qpm, c=PARAM.double()).sum(-1)
    torch.testing.assert_close(rows[live], torch.ones_like(rows[live]), atol=1e-12, rtol=0)
    assert NORMALIZERS["ssmax"].rows_sum_to_one
    assert not NORMALIZERS["sigmoid"].rows_sum_to_one and not NORMALIZERS["sink"].rows_sum_to_one
    assert not any(NORMALIZERS[n].over_queries or NORMALIZERS[n].causal_only
                   for n in ("sigmoid", "sink", "ssmax"))


# ----------------------------------------------------------------------------- the authors' code
# Each re-statement follows the authors' reference computation (written anew here), on raw
# scores with the repo's masks as additive -inf, in float64; values and gradients are compared
# with the scheme's reference, the parameter's gradient included.
def _scores(q, k):
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])


def _additive_mask(S_q, S_k, kpm, qpm, causal):
    valid = _valid(S_q, S_k, kpm, qpm, causal)
    return torch.zeros(valid.shape, dtype=F64).masked_fill(~valid, float("-inf"))


def sink_as_gpt_oss(q, k, v, sinks, mask):
    """openai/gpt-oss torch/model.py `sdpa`: the head's sink logit appended as a last column,
    a softmax over the row, the column dropped."""
    logits = _scores(q, k) + mask
    column = sinks.reshape(1, -1, 1, 1).expand(logits.shape[0], -1, logits.shape[2], 1)
    return torch.softmax(torch.cat([logits, column], -1), -1)[..., :-1] @ v


def sink_as_transformers(q, k, v, sinks, mask):
    """transformers models/gpt_oss eager_attention_forward: the same with the row maximum
    subtracted first (the sink first here, as x-transformers' head_learned_sink puts it)."""
    logits = _scores(q, k) + mask
    column = sinks.reshape(1, -1, 1, 1).expand(logits.shape[0], -1, logits.shape[2], 1)
    combined = torch.cat([column, logits], -1)
    combined = combined - combined.max(-1, keepdim=True).values
    return torch.softmax(combined, -1)[..., 1:] @ v


def sigmoid_as_apple(q, k, v, attn_bias, mask, attn_temp=0.0):
    """apple/ml-sigmoid-attention Attention.forward: logits * exp(attn_temp) + attn_bias, then
    the elementwise sigmoid (masked logits -inf: weight 0)."""
    return torch.sigmoid((_scores(q, k) + mask) * math.exp(attn_temp) + attn_bias) @ v


def ssmax_as_paper(q, k, v, c, mask):
    """arXiv 2501.19399 Eq. (SSMax): z_i -> n^(s z_i) / sum_j n^(s z_j), n the row's size."""
    logits = _scores(q, k) + mask
    valid = torch.isfinite(logits)
    n = valid.sum(-1, keepdim=True).double()
    powers = torch.where(valid, n ** (c * torch.where(valid, logits, 0.0)), 0.0)
    total = powers.sum(-1, keepdim=True)
    return (powers / torch.where(total > 0, total, 1.0)) @ v


def _compare(ours, theirs, tensors, g_out):
    a, b = ours(*tensors), theirs(*tensors)
    torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)
    ga = torch.autograd.grad((a * g_out).sum(), tensors)
    gb = torch.autograd.grad((b * g_out).sum(), tensors)
    for x, y in zip(ga, gb):
        assert torch.isfinite(x).all()
        torch.testing.assert_close(x, y, atol=1e-10, rtol=1e-10)


def _problem(causal, seed=7, S_q=6, S_k=6):
    q, k, v, _, kpm, qpm = padded_problem(S_q, S_k, 8, B=2, H=H, seed=seed, dtype=F64, scale=2.0)
    g_out = torch.randn(2, H, S_q, 8, dtype=F64, generator=torch.Generator().manual_seed(seed))
    return q, k, v, kpm, qpm, _additive_mask(S_q, S_k, kpm, qpm, causal), g_out


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("theirs", [sink_as_gpt_oss, sink_as_transformers], ids=["gpt-oss", "transformers"])
def test_sink_matches_gpt_oss_and_transformers(theirs, causal):
    """Items with padded keys and queries, and one without (rows of padded queries: gpt-oss's
    softmax puts their whole mass on the sink, dropped: 0, as ours)."""
    q, k, v, kpm, qpm, mask, g_out = _problem(causal)
    sinks = torch.tensor([0.4, -2.0], dtype=F64)
    tensors = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
    _compare(lambda q, k, v, b: reference_attend(q, k, v, "sink", kpm, qpm, causal, b=b.view(1, H, 1, 1)),
             lambda q, k, v, b: theirs(q, k, v, b, mask), tensors, g_out)


def test_softmax_one_is_the_sink_fixed_at_zero():
    """learned=False, sink_init=0: exp(s) / (1 + sum exp(s)), Miller's softmax_1 (x-transformers'
    add_zero_kv: a key of logit 0 whose value is 0)."""
    q, k, v, kpm, qpm, mask, g_out = _problem(False, seed=8)
    tensors = [t.clone().requires_grad_() for t in (q, k, v)]
    zero_kv = lambda q, k, v: sink_as_gpt_oss(q, k, v, torch.zeros(H, dtype=F64), mask)
    _compare(lambda q, k, v: reference_attend(q, k, v, "sink", kpm, qpm, learned=False),
             zero_kv, tensors, g_out)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_learned_sigmoid_matches_apples_attention(causal):
    q, k, v, kpm, qpm, mask, g_out = _problem(causal, seed=9)
    tensors = [t.clone().requires_grad_() for t in (q, k, v)] + [torch.tensor(-1.7, dtype=F64, requires_grad=True)]
    _compare(lambda q, k, v, b: reference_attend(q, k, v, "sigmoid", kpm, qpm, causal, bias="learned", b=b),
             lambda q, k, v, b: sigmoid_as_apple(q, k, v, b, mask), tensors, g_out)


def test_log_n_sigmoid_is_apples_fixed_bias_where_every_row_sees_every_key():
    """Without padding and without causality every row has n = S_k keys: b = -log S_k is the
    authors' one bias (their configs: -7.62 = -log 2048). Causal rows differ: ours take -log(i + 1)
    per row, the authors' code -log S for all (the documented difference)."""
    q, k, v, _, _, _, g_out = _problem(False, seed=10)
    none = torch.zeros(2, 6, dtype=torch.bool)
    tensors = [t.clone().requires_grad_() for t in (q, k, v)]
    _compare(lambda q, k, v: reference_attend(q, k, v, "sigmoid", none, none, bias="log_n"),
             lambda q, k, v: sigmoid_as_apple(q, k, v, -math.log(6), torch.zeros(1, dtype=F64)),
             tensors, g_out)
    causal_mask = _additive_mask(6, 6, none, none, True)
    ours = reference_attend(q, k, v, "sigmoid", none, none, True, bias="log_n")
    theirs = sigmoid_as_apple(q, k, v, -math.log(6), causal_mask)
    torch.testing.assert_close(ours[..., -1, :], theirs[..., -1, :], atol=1e-12, rtol=0)  # n = 6
    assert ((ours[..., :-1, :] - theirs[..., :-1, :]).abs().amax(-1) > 1e-3).all()


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_ssmax_matches_the_papers_formula(causal):
    q, k, v, kpm, qpm, mask, g_out = _problem(causal, seed=11)
    tensors = [t.clone().requires_grad_() for t in (q, k, v)] + [PARAM.double().requires_grad_()]
    _compare(lambda q, k, v, c: reference_attend(q, k, v, "ssmax", kpm, qpm, causal, c=c),
             lambda q, k, v, c: ssmax_as_paper(q, k, v, c, mask), tensors, g_out)


def test_ssmax_is_not_the_shift_invariant_misquote():
    """exp(s_i - c log n) / sum_j exp(s_j - c log n) is the plain softmax; SSMax is not (n > 1)."""
    q, k, _, _, _ = padded_problem(5, 9, 8, B=1, H=H, seed=12, dtype=F64)[:5]
    ssmax = attention_weights(q, k, "ssmax", c=1.0)
    softmax = attention_weights(q, k, "unas")
    assert (ssmax - softmax).abs().max() > 0.05
    torch.testing.assert_close(attention_weights(q, k, "ssmax", c=torch.tensor(1 / math.log(9), dtype=F64)), softmax,
                               atol=1e-12, rtol=0)  # c log n = 1: the softmax


# ----------------------------------------------------------------------------- parameters
@pytest.mark.parametrize(("spec", "key", "init"), [
    ({"scheme": "sink"}, "b", 0.0),
    ({"scheme": "sink", "sink_init": -1.5, "param_lr": 0.01}, "b", -1.5),
    ({"scheme": "ssmax"}, "c", 0.43),
    ({"scheme": "sigmoid", "bias": "learned", "bias_init_n": 32}, "b", -math.log(32)),
])
def test_parameters_are_found_reported_and_train(spec, key, init):
    torch.manual_seed(0)
    E = 16
    mha = MultiHeadAttention(E, H, spec=spec)
    params = scheme_parameters(mha)
    assert len(params) == 1 and params[0][1].shape == (H,)
    name, param = params[0]
    assert name.startswith("normalizer.")
    assert mha.normalizer.param_lr == spec.get("param_lr")
    reported = mha.normalizer.reported()
    assert list(reported) == [key] and reported[key].dtype == torch.float32
    torch.testing.assert_close(reported[key], torch.full((H,), init))
    values = scheme_values(mha)
    assert list(values) == [f"{spec['scheme']}_{key}"] and list(values[f"{spec['scheme']}_{key}"]) == [""]
    assert torch.equal(values[f"{spec['scheme']}_{key}"][""], reported[key])
    x = torch.randn(2, 5, E)
    kpm = torch.tensor([[False] * 5, [False, False, False, True, True]])
    mha(x, key_padding_mask=kpm, query_padding_mask=kpm).square().sum().backward()
    assert param.grad is not None and torch.isfinite(param.grad).all() and (param.grad != 0).all()
    torch.optim.SGD([param], lr=0.1).step()
    assert (mha.normalizer.reported()[key] != reported[key]).all()  # the report is a copy


@pytest.mark.parametrize("spec", [{"scheme": "sink", "learned": False}, {"scheme": "ssmax", "learned": False},
                                  {"scheme": "sigmoid"}, {"scheme": "sigmoid", "bias": "zero"}])
def test_fixed_schemes_own_no_parameter(spec):
    mha = MultiHeadAttention(16, H, spec=spec)
    assert scheme_parameters(mha) == [] and mha.normalizer.reported() == {}


def test_a_module_computes_what_attend_computes_with_its_parameter():
    """The module's parameter reaches `weights` as the functional form's explicit input."""
    q, k, v, _, kpm, qpm = padded_problem(5, 6, 8, H=H, seed=13)
    for spec, name in (({"scheme": "sink"}, "b"), ({"scheme": "ssmax"}, "c"),
                       ({"scheme": "sigmoid", "bias": "learned"}, "b")):
        norm = AttentionSpec.from_config(spec).build_normalizer(H)
        with torch.no_grad():
            next(norm.parameters()).copy_(PARAM.view(H))
        got = norm(q, k, v, kpm, qpm)
        options = {k_: v_ for k_, v_ in spec.items() if k_ != "scheme"}
        expected = reference_attend(q, k, v, spec["scheme"], kpm, qpm, **options, **{name: PARAM})
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
    # without the input, the functional form uses the option's starting value
    start = reference_attend(q, k, v, "sink", kpm, qpm, sink_init=0.5)
    torch.testing.assert_close(start, reference_attend(q, k, v, "sink", kpm, qpm, b=0.5), atol=1e-7, rtol=0)
    start = reference_attend(q, k, v, "ssmax", kpm, qpm)
    torch.testing.assert_close(start, reference_attend(q, k, v, "ssmax", kpm, qpm, c=0.43), atol=1e-7, rtol=0)


# ----------------------------------------------------------------------------- options
@pytest.mark.parametrize(("scheme", "options", "message"), [
    ("sigmoid", {"bias": "lognn"}, r"model.bias='lognn' is not a sigmoid bias; use one of log_n, learned, zero"),
    ("sigmoid", {"bias_init_n": 0}, r"model.bias_init_n=0 must be >= 1"),
    ("sigmoid", {"bias_init_n": 2.5}, r"model.bias_init_n=2.5: sigmoid's option bias_init_n must be int"),
    ("sigmoid", {"param_lr": 0}, r"model.param_lr=0 must be > 0 \(or null"),
    ("sink", {"sink_init": float("inf")}, r"model.sink_init=inf must be a finite logit"),
    ("sink", {"learned": "yes"}, r"model.learned='yes': sink's option learned must be bool"),
    ("sink", {"param_lr": -1.0}, r"model.param_lr=-1 must be > 0"),
    ("ssmax", {"scale_init": float("nan")}, r"model.scale_init=nan must be finite"),
    ("ssmax", {"temperature": 2.0}, r"model=ssmax has no option temperature; its options are .*learned, param_lr, scale_init"),
])
def test_options_are_validated(scheme, options, message):
    with pytest.raises(ConfigError, match=message):
        AttentionSpec(scheme, **options)


def test_option_bounds_and_infinite_ssmax_scale():
    AttentionSpec("sigmoid", bias="learned", bias_init_n=1)  # b starts at -log 1 = 0: allowed
    with pytest.raises(ConfigError, match=r"^model\.scale_init=inf must be finite"):
        AttentionSpec("ssmax", scale_init=float("inf"))
    with pytest.raises(ConfigError, match=r"^model\.scale_init=-inf must be finite"):
        AttentionSpec("ssmax", scale_init=float("-inf"))


def test_the_functional_learned_sigmoid_starts_at_its_initial_bias():
    """Without heads (attend, attention_weights) a learned sigmoid owns no b: it takes the one
    given, else b = -log(bias_init_n)."""
    q, k, _, _, kpm, _ = padded_problem(5, 5, 4, B=2, H=H, dtype=F64)
    w = attention_weights(q, k, "sigmoid", key_padding_mask=kpm, bias="learned", bias_init_n=8)
    ref = torch.sigmoid(masked_logits(q, k, kpm) - math.log(8))
    torch.testing.assert_close(w, torch.where(torch.isfinite(masked_logits(q, k, kpm)), ref, 0.0))


@pytest.mark.parametrize(("case", "scheme", "options", "name"), [c for c in CASES if c[3]], ids=[c[0] for c in CASES if c[3]])
def test_weights_keep_the_logits_dtype_whatever_the_parameters(case, scheme, options, name):
    """A float64 b or c on float32 logits gives float32 weights, as the docs promise (float32,
    float64 stays), and the same values as a float32 parameter."""
    q, k = (t.float() for t in padded_problem(5, 5, 4, B=2, H=H, dtype=F64)[:2])
    w = attention_weights(q, k, scheme, **options, **{name: PARAM.double()})
    assert w.dtype == torch.float32
    torch.testing.assert_close(w, attention_weights(q, k, scheme, **options, **{name: PARAM}))


@pytest.mark.parametrize(("spec", "name"), [({"scheme": "sink"}, "sink"), ({"scheme": "ssmax"}, "scale"),
                                            ({"scheme": "sigmoid", "bias": "learned"}, "bias")])
def test_a_parameters_name_is_the_key_its_checkpoints_hold(spec, name):
    """Saved runs hold the parameter under this name: a value saved there loads into the scheme."""
    mha = MultiHeadAttention(16, H, spec=spec)
    assert [n for n, _ in scheme_parameters(mha)] == [f"normalizer.{name}"]
    state = mha.state_dict()
    state[f"normalizer.{name}"] = torch.tensor([0.25, -0.5])
    mha.load_state_dict(state)
    (reported,) = mha.normalizer.reported().values()
    assert reported.tolist() == [0.25, -0.5]

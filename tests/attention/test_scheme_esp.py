"""ESPFormer (Shahbazi et al., ICML 2025): doubly stochastic under padding, float32 against
float64, the chunked path against the reference, parity with a re-statement of the authors'
`attentions/esp.py` forward, the refusal in causal attention, and options."""

from __future__ import annotations

import pytest
import torch
from helpers.kernel_cases import padded_problem

from attnlab.attention import AttentionSpec, attend, attention_weights
from attnlab.attention.functional import candidates
from attnlab.attention.kernels import esp as esp_kernel
from attnlab.attention.schemes import NORMALIZERS, esp
from attnlab.attention.schemes.esp import ESPOptions
from attnlab.errors import ConfigError


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny problems: one thread (on a loaded machine, several threads only wait for each other)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def problem(S_q, S_k=None, d=8, H=2, dtype=torch.float64, seed=0):
    q, k, v, _, kpm, qpm = padded_problem(S_q, S_k or S_q, d, B=4, H=H, dtype=dtype, seed=seed)
    return q, k, v, kpm, qpm


def grads_of(fn, tensors, g):
    out = fn()
    return (out, *torch.autograd.grad((out * g).sum(), tensors))


def test_scheme_is_registered_over_queries_with_its_chunked_path():
    cls = NORMALIZERS["esp"]
    assert cls.over_queries and cls.rows_sum_to_one and not cls.causal_only
    assert cls.fast_paths == esp.ESP_PATHS == (esp.ESP_CHUNKED,)
    assert candidates("esp", "cpu", torch.float32) == ["chunked", "reference"]


@pytest.mark.parametrize("shape", [(9, 9), (7, 4), (1, 1), (5, 1)], ids=["self", "cross", "S1", "one-key"])
@pytest.mark.parametrize("slices", [None, 5])
def test_doubly_stochastic_under_key_and_query_padding(shape, slices):
    """Valid rows sum to 1, valid columns to n_q / n_k (1 where as many valid queries as keys),
    padded rows and columns are 0, an all-padded example is all 0; never NaN."""
    q, k, _, kpm, qpm = problem(*shape, dtype=torch.float32)
    w = attention_weights(q, k, "esp", kpm, qpm, slices=slices)
    assert torch.isfinite(w).all()
    vq, vk = (~qpm).float(), (~kpm).float()
    nq, nk = vq.sum(-1), vk.sum(-1)
    rows = w.sum(-1)
    cols = w.sum(-2)
    has_keys = (nk > 0)[:, None, None].float()
    torch.testing.assert_close(rows, (vq[:, None, :] * has_keys).expand_as(rows), atol=1e-5, rtol=0)
    expect_cols = vk[:, None, :] * (nq / nk.clamp(min=1))[:, None, None]
    torch.testing.assert_close(cols, expect_cols.expand_as(cols), atol=1e-5, rtol=0)
    assert (w[~(vq[:, None, :, None] * vk[:, None, None, :]).bool().expand_as(w)] == 0).all()
    if shape[0] == shape[1]:  # the unpadded example: exactly doubly stochastic
        torch.testing.assert_close(w[1].sum(-2), torch.ones_like(w[1].sum(-2)), atol=1e-5, rtol=0)


@pytest.mark.parametrize("hard", [True, False])
@pytest.mark.parametrize("shape", [(9, 9), (7, 4), (1, 1)], ids=["self", "cross", "S1"])
def test_float32_equals_float64_values_and_gradients(shape, hard):
    q, k, v, kpm, qpm = problem(*shape)
    g = torch.randn(4, 2, shape[0], 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    results = {}
    for dtype in (torch.float32, torch.float64):
        ts = [t.to(dtype).requires_grad_() for t in (q, k, v)]
        results[dtype] = grads_of(lambda ts=ts: attend(*ts, "esp", kpm, qpm, hard=hard), ts,
                                  g.to(dtype))
    for a, b in zip(results[torch.float32], results[torch.float64]):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a.double(), b, atol=2e-4, rtol=1e-3)


@pytest.mark.parametrize("hard", [True, False])
@pytest.mark.parametrize("tau", [10.0, 300.0])
@pytest.mark.parametrize("shape", [(9, 9), (7, 4)], ids=["self", "cross"])
def test_chunked_path_equals_the_reference(shape, tau, hard):
    """Blocks of one and of three slices (of 8) against all slices at once, values and
    gradients; tau = 300 makes the mixture peaked, so its gradient matters."""
    q, k, _, kpm, qpm = problem(*shape)
    opts = ESPOptions(tau=tau, hard=hard)
    g = torch.randn(4, 2, *shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    ts = [t.clone().requires_grad_() for t in (q, k)]
    ref = grads_of(lambda: esp_kernel.esp_weights(*ts, kpm, qpm, opts), ts, g)
    per_slice = 4 * 2 * shape[0] * shape[1]
    for block in (1, 3):
        got = grads_of(lambda block=block: esp_kernel.esp_weights_chunked(
            *ts, kpm, qpm, opts, block * per_slice), ts, g)
        for a, b in zip(got, ref):
            torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-9)


def test_attend_takes_the_chunked_path_and_matches_the_reference():
    q, k, v, kpm, qpm = problem(6, 6, dtype=torch.float32)
    spec = AttentionSpec("esp")
    norm = spec.build_normalizer(2)
    call = norm.call(q, k, v, kpm, qpm)
    torch.testing.assert_close(esp.ESP_CHUNKED(norm, call), norm.reference(call), atol=1e-6, rtol=0)
    torch.testing.assert_close(attend(q, k, v, "esp", kpm, qpm), norm.reference(call), atol=1e-6, rtol=0)


# ----------------------------------------------------------------------------- the authors' code
def authors_esp(q, k, valid=None, tau=1e-3, temperature=10.0, hard=False):
    """A re-statement of `Esp.forward` with `SoftSort_p2` and the closed-form `GammaAggregator`
    in dariansal/ESPFormer, attentions/esp.py, as `EspAttention` calls it (q, k scaled by
    d^-1/2): padded positions (valid False, one mask for queries and keys) are set to 1e18; each
    of the d coordinates is soft-sorted descending, rows (ranks) softmax over elements; plans
    Pu^T Pv; weights softmax(-temperature * <cdist(X, Y), plan>); hard: topk straight-through."""
    X, Y = q * q.shape[-1] ** -0.5, k * k.shape[-1] ** -0.5
    if valid is not None:
        keep = valid[:, None, :, None].expand_as(X)
        X = torch.where(keep, X, torch.full_like(X, 1e18))
        Y = torch.where(keep, Y, torch.full_like(Y, 1e18))

    def softsort(s):
        s = s.transpose(3, 2).unsqueeze(-1)
        ranked = s.sort(dim=3, descending=True).values
        p = (-(s.transpose(4, 3) - ranked) ** 2 / tau).softmax(-1)
        if hard:
            one = torch.zeros_like(p).scatter_(-1, p.topk(1, -1)[1], 1.0)
            p = (one - p).detach() + p
        return p

    gamma = softsort(X).transpose(-1, -2) @ softsort(Y)
    paid = (torch.cdist(X, Y, p=2).unsqueeze(2) * gamma).sum(dim=(-1, -2))
    e = torch.exp(-temperature * (paid - paid.min(dim=-1, keepdim=True).values))
    return (gamma * (e / e.sum(-1, keepdim=True))[..., None, None]).sum(2)


@pytest.mark.parametrize("hard", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_parity_with_the_authors_forward(hard, padded):
    """Values and gradients of the valid block. Their padding is one mask for queries and keys
    (self-attention) and gives the padded block mass among itself: compared on valid pairs only.
    S = 12 < 25, where their cdist computes distances directly (beyond, its matmul expansion
    of the 1e18-filled rows loses the padded block's zero cost)."""
    gen = torch.Generator().manual_seed(3)
    S, d = 12, 8
    q, k = (torch.randn(3, 2, S, d, generator=gen, dtype=torch.float64) for _ in range(2))
    valid = torch.ones(3, S, dtype=torch.bool)
    if padded:
        valid[0, 9:] = False
        valid[2, ::3] = False
    pad = ~valid
    pair = (valid[:, None, :, None] & valid[:, None, None, :]).double()
    g = torch.randn(3, 2, S, S, generator=gen, dtype=torch.float64) * pair
    ts = [t.clone().requires_grad_() for t in (q, k)]
    theirs = grads_of(lambda: authors_esp(*ts, valid if padded else None, hard=hard) * pair, ts, g)
    ours = grads_of(lambda: attention_weights(*ts, "esp", pad, pad, hard=hard), ts, g)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-7)


def test_refused_in_causal_attention_and_in_a_cascade():
    q, k, v, _, _ = problem(4)
    with pytest.raises(ConfigError, match="leaks the future"):
        attend(q, k, v, "esp", causal=True)
    with pytest.raises(ConfigError, match="not from logits"):
        AttentionSpec("esp").build_normalizer(2).weights(torch.zeros(1, 2, 3, 3))


@pytest.mark.parametrize("key, value, message", [
    ("tau", -1.0, r"model.tau=-1.0 must be .* >= 0 .* model.tau=10"),
    ("tau", float("inf"), r"model.tau=inf must be a finite"),
    ("softsort_tau", 0.0, r"model.softsort_tau=0.0 must be .* > 0 .* model.softsort_tau=0.001"),
    ("slices", 0, r"model.slices=0 must be null .* model.slices=null"),
    ("seed", -2, r"model.seed=-2 must be an integer >= 0"),
    ("hard", "yes", r"model.hard='yes': esp's option hard must be bool"),
])
def test_options_are_validated(key, value, message):
    with pytest.raises(ConfigError, match=message):
        AttentionSpec("esp", **{key: value})


def test_config_defaults_are_the_options():
    spec = AttentionSpec.from_config("esp")
    assert spec.scheme == "esp"
    norm = spec.build_normalizer(2)
    assert norm.options == ESPOptions() == ESPOptions(tau=10.0, softsort_tau=1e-3, hard=True)


def test_options_at_their_bounds_and_of_the_wrong_kind():
    """The bounds are what the docs say: tau >= 0 (0: the plans' mean), slices >= 1; numbers of
    another kind are refused where the dataclass is built directly (the spec checks types first)."""
    for ok in ({"tau": 0.0}, {"tau": 0.5}, {"slices": 1}, {"seed": 0}):
        ESPOptions(**ok)
    for bad, message in (({"hard": 1}, r"^model\.hard=1 must be true or false for esp, e\.g\. model\.hard=true$"),
                         ({"slices": 2.5}, r"^model\.slices=2\.5 must be null"),
                         ({"slices": True}, r"^model\.slices=True must be null"),
                         ({"seed": 1.5}, r"^model\.seed=1\.5 must be an integer >= 0"),
                         ({"seed": True}, r"^model\.seed=True must be an integer >= 0")):
        with pytest.raises(ConfigError, match=message):
            ESPOptions(**bad)


def test_the_chunked_path_serves_what_it_says_and_nothing_else():
    esp_ = AttentionSpec("esp").build_normalizer()
    for device, dtype in (("cpu", torch.float32), ("cpu", torch.float64), ("cuda", torch.float16),
                          ("cuda", torch.bfloat16), ("cuda", torch.float32)):
        assert esp_.candidates(device, dtype) == ["chunked", "reference"], (device, dtype)
        assert esp_.candidates(device, dtype, causal=True) == ["reference"], (device, dtype)
    for device, dtype in (("cpu", torch.float16), ("cpu", torch.bfloat16), ("cuda", torch.float64),
                          ("mps", torch.float32), ("xla", torch.float32)):
        assert esp_.candidates(device, dtype) == ["reference"], (device, dtype)


@pytest.mark.parametrize("path", ["chunked", "reference"])
def test_dropout_reaches_the_weights_on_every_path(path):
    from attnlab.attention.paths import AttentionCall
    from attnlab.attention.schemes.normalizer import apply_weights

    q, k, v, kpm, qpm = problem(6)
    esp_ = AttentionSpec("esp").build_normalizer()
    call = AttentionCall(q, k, v, kpm, qpm, False, 0.5, {}, None)
    run = esp.ESP_CHUNKED.run if path == "chunked" else esp_.reference
    torch.manual_seed(3)
    dropped = run(esp_, call) if path == "chunked" else run(call)
    torch.manual_seed(3)
    by_hand = apply_weights(esp_.attention_weights(q, k, kpm, qpm), v, 0.5)  # the same seed drops alike
    torch.testing.assert_close(dropped, by_hand)
    assert (dropped - attend(q, k, v, "esp", key_padding_mask=kpm, query_padding_mask=qpm)).abs().max() > 1e-2


def test_attention_weights_are_full_by_default_and_check_their_call():
    q, k, _, kpm, qpm = problem(5)
    esp_ = AttentionSpec("esp").build_normalizer()
    torch.testing.assert_close(esp_.attention_weights(q, k), attention_weights(q, k, "esp", causal=False))
    with pytest.raises(ConfigError, match="leaks the future"):
        esp_.attention_weights(q, k, causal=True)
    for key, mask in (("key_padding_mask", kpm), ("query_padding_mask", qpm)):
        with pytest.raises(ConfigError, match=rf"^{key} must be a bool tensor"):
            esp_.attention_weights(q, k, **{key: mask.double()})
    with pytest.raises(ConfigError, match=r"^scheme='esp' computes its weights from q and k \(sliced transport "
                                          r"plans\), not from logits: it cannot follow a logit transform \(coda, "
                                          r"realformer\); use model=esp alone$"):
        esp_.weights(torch.zeros(1, 2, 3, 3))

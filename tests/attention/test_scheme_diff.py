"""model=diff: differential attention (Ye et al., ICLR 2025) as a head scheme (schemes/diff.py)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnlab.attention import AttentionSpec, MultiHeadAttention, record_attention, scheme_values
from attnlab.attention.schemes.diff import lambda_init_fn
from attnlab.errors import ConfigError

E, H = 16, 2  # two differential heads of 8 features: q/k halves of 4


def padded(batch=2, S=6, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, S, E, generator=g, dtype=dtype)
    mask = torch.zeros(batch, S, dtype=torch.bool)
    mask[1, -2:] = True
    return x, mask


def authors_v1(x, mask, m, lambda_init):
    """A re-statement of MultiheadDiffAttn.forward (microsoft/unilm,
    Diff-Transformer/multihead_diffattn.py) without rotary embeddings, MHA, with an additive
    key-padding mask in place of their causal one: 2H query/key heads of d/2, H value heads of
    d, softmax maps of heads 2h and 2h+1 subtracted with lambda, RMSNorm over each head's d
    features (one weight), times 1 - lambda_init."""
    s = m.head_scheme
    bsz, tgt_len, _ = x.shape
    head_dim = E // H // 2
    q = m.q_proj(x).view(bsz, tgt_len, 2 * H, head_dim).transpose(1, 2)
    k = m.k_proj(x).view(bsz, tgt_len, 2 * H, head_dim).transpose(1, 2)
    v = m.v_proj(x).view(bsz, tgt_len, H, 2 * head_dim).transpose(1, 2)
    q = q * head_dim ** -0.5
    w = q @ k.transpose(-1, -2)
    w = w + torch.where(mask, float("-inf"), 0.0).to(w.dtype)[:, None, None, :]
    w = F.softmax(w, dim=-1)
    lambda_1 = torch.exp(torch.sum(s.lambda_q1 * s.lambda_k1, dim=-1))
    lambda_2 = torch.exp(torch.sum(s.lambda_q2 * s.lambda_k2, dim=-1))
    lambda_full = lambda_1 - lambda_2 + lambda_init
    w = w.view(bsz, H, 2, tgt_len, tgt_len)
    w = w[:, :, 0] - lambda_full * w[:, :, 1]
    attn = w @ v
    attn = attn * torch.rsqrt(attn.pow(2).mean(-1, keepdim=True) + 1e-5) * s.subln.weight
    attn = attn * (1 - lambda_init)
    return m.out_proj(attn.transpose(1, 2).reshape(bsz, tgt_len, E))


def authors_v2(x, m):
    """A re-statement of MultiheadFlashDiffV2.forward (Diff-Transformer-V2/multihead_flashdiffv2.py)
    without rotary embeddings: 2H query heads (head 2h: our q_proj's head h, 2h+1: q2_proj's) on H
    key/value heads (GQA: query heads 2h and 2h+1 read key head h), causal; the odd heads' output
    subtracted with sigmoid(lambda_proj(x))."""
    bsz, L, _ = x.shape
    d = E // H
    q1 = m.q_proj(x).view(bsz, L, H, d)
    q2 = m.head_scheme.q2_proj(x).view(bsz, L, H, d)
    q = torch.stack([q1, q2], dim=3).view(bsz, L, 2 * H, d).transpose(1, 2)
    k = m.k_proj(x).view(bsz, L, H, d).transpose(1, 2).repeat_interleave(2, dim=1)
    v = m.v_proj(x).view(bsz, L, H, d).transpose(1, 2).repeat_interleave(2, dim=1)
    attn = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)  # (B, L, 2H, d)
    lam = m.head_scheme.lambda_proj(x)
    attn = attn[:, :, 0::2] - torch.sigmoid(lam).unsqueeze(-1) * attn[:, :, 1::2]
    return m.out_proj(attn.reshape(bsz, L, E))


def randomized(m):
    with torch.no_grad():  # away from the init, so that a wrong lambda or norm cannot pass by luck
        for p in m.head_scheme.parameters():
            p.normal_(0, 0.5) if p.dim() == 1 or p.shape[0] == 1 else None
        if m.head_scheme.version == 1:
            m.head_scheme.subln.weight.uniform_(0.5, 1.5)
    return m


@pytest.mark.parametrize("layer_index", [0, 3])
def test_v1_matches_the_published_forward_values_and_gradients(layer_index):
    torch.manual_seed(0)
    m = randomized(MultiHeadAttention(E, H, spec="diff", layer_index=layer_index).double())
    x, mask = padded()
    x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ours = m(x1, key_padding_mask=mask)
    params = [m.head_scheme.lambda_q1, m.head_scheme.lambda_k2, m.head_scheme.subln.weight, m.q_proj.weight]
    g_ours = torch.autograd.grad(ours.pow(2).sum(), [x1, *params])
    theirs = authors_v1(x2, mask, m, 0.8 - 0.6 * math.exp(-0.3 * layer_index))  # their depth = index
    g_theirs = torch.autograd.grad(theirs.pow(2).sum(), [x2, *params])
    torch.testing.assert_close(ours, theirs)
    for a, b in zip(g_ours, g_theirs):
        torch.testing.assert_close(a, b)


def test_v2_matches_the_published_forward_values_and_gradients():
    torch.manual_seed(0)
    m = MultiHeadAttention(E, H, spec={"scheme": "diff", "version": 2}, is_decoder=True).double()
    x, _ = padded()
    x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ours = m(x1, causal=True)
    params = [m.head_scheme.q2_proj.weight, m.head_scheme.lambda_proj.weight, m.k_proj.weight]
    g_ours = torch.autograd.grad(ours.pow(2).sum(), [x1, *params])
    theirs = authors_v2(x2, m)
    g_theirs = torch.autograd.grad(theirs.pow(2).sum(), [x2, *params])
    torch.testing.assert_close(ours, theirs)
    for a, b in zip(g_ours, g_theirs):
        torch.testing.assert_close(a, b)


def test_lambda_init_by_depth_and_option():
    assert lambda_init_fn(0) == pytest.approx(0.2)
    for l in (0, 1, 5, 11):
        m = MultiHeadAttention(E, H, spec="diff", layer_index=l)
        assert m.head_scheme.lambda_init == pytest.approx(0.8 - 0.6 * math.exp(-0.3 * l))
    m = MultiHeadAttention(E, H, spec={"scheme": "diff", "lambda_init": 0.5}, layer_index=4)
    assert m.head_scheme.lambda_init == 0.5
    # the published init: lambda vectors N(0, 0.1^2), so lambda starts near lambda_init
    lam = m.head_scheme.reported()["lambda"]
    assert lam.shape == (H,) and (lam - 0.5).abs().max() < 0.2
    per_head = MultiHeadAttention(E, H, spec={"scheme": "diff", "lambda_per": "head"})
    assert per_head.head_scheme.lambda_q1.shape == (H, E // H // 2)


@pytest.mark.parametrize("version", [1, 2])
def test_no_nan_under_padding_and_recorded_weights(version):
    torch.manual_seed(0)
    m = MultiHeadAttention(E, H, spec={"scheme": "diff", "version": version}, dropout=0.1)
    x, mask = padded(dtype=torch.float32)
    mask[0, :] = True  # an example without any valid key
    x.requires_grad_(True)
    with record_attention(m) as rec:
        out = m(x, key_padding_mask=mask, query_padding_mask=mask)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())
    w = next(iter(rec.records.values())).weights  # the effective A = A1 - lambda A2
    assert w[0].abs().max() == 0 and w[1, :, -2:].abs().max() == 0 and w[1, :, :, -2:].abs().max() == 0
    if version == 1:  # valid rows sum to 1 - lambda
        lam = m.head_scheme.lambda_full().detach()
        torch.testing.assert_close(w[1, :, :4].sum(-1), (1 - lam).view(-1, 1).expand(H, 4))
    else:
        assert (w[1, :, :4].sum(-1) < 1).all()


def test_reported_scheme_values_and_parameter_groups():
    from attnlab.attention import TransformerEncoderLayer
    from attnlab.task_module import parameter_groups

    layers = torch.nn.ModuleList(TransformerEncoderLayer(E, H, 32, spec={"scheme": "diff", "param_lr": 0.05},
                                                         layer_index=i) for i in range(2))
    values = scheme_values(layers)["diff_lambda"]
    assert list(values) == ["0.self_attn", "1.self_attn"] and values["1.self_attn"].shape == (H,)
    groups = parameter_groups(layers, weight_decay=0.01, lr=1e-3)
    fast = [g for g in groups if g.get("lr") == 0.05]
    assert len(fast) == 1 and len(fast[0]["params"]) == 8  # 4 lambda vectors per layer
    assert fast[0]["weight_decay"] == 0.0


def test_spec_validation_and_refusals():
    spec = AttentionSpec("diff", normalization="dnas", version=2)
    assert AttentionSpec.from_config(spec.to_dict()) == spec
    assert spec.for_decoder().normalization == "unas"  # the decoder copy normalizes over keys
    with pytest.raises(ConfigError, match="model.version=3 must be 1 or 2"):
        AttentionSpec("diff", version=3)
    with pytest.raises(ConfigError, match="head size is 3"):
        MultiHeadAttention(6, 2, spec="diff")
    with pytest.raises(ConfigError, match="normalizes over queries|decoder"):
        MultiHeadAttention(E, H, spec=AttentionSpec("diff", normalization="dnas"), is_decoder=True)
    from attnlab.hf.adapter import SchemeAttention

    with pytest.raises(ConfigError, match="model=diff needs parameters of its own"):
        SchemeAttention(AttentionSpec("diff"), H, E // H)


def test_probe_runs_model_diff(tmp_path, data_dir):
    from helpers.cards import TINY
    from helpers.cli import QUIET, metrics_files, run_here

    run_here(["task=probe", "model=diff", "debug=fast", "callbacks=minimal", *TINY["probe"], *QUIET],
             tmp_path, data_dir)
    (record,) = metrics_files(tmp_path / "outputs")
    assert record["status"] == "ok" and record["scheme_params"]["diff_lambda"]


# ----------------------------------------------------------------------------- the head scheme called directly
def heads(seed=0, B=2, S=5, d=8, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, S, d, generator=g, dtype=dtype) for _ in range(3))
    mask = torch.zeros(B, S, dtype=torch.bool)
    mask[1, -2:] = True
    return q, k, v, mask


def softmax_by_hand(q, k, mask):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(s.masked_fill(mask[:, None, None, :], float("-inf")), -1)


def test_v1_lambda_per_head_is_each_heads_own_in_the_maps_difference():
    torch.manual_seed(0)
    m = randomized(MultiHeadAttention(E, H, spec={"scheme": "diff", "lambda_per": "head"}).double())
    s, unas = m.head_scheme, m.normalizer
    with torch.no_grad():  # (H, d/2) vectors, away from the init
        for p in (s.lambda_q1, s.lambda_k1, s.lambda_q2, s.lambda_k2):
            p.normal_(0, 0.5)
    lam = torch.exp((s.lambda_q1 * s.lambda_k1).sum(-1)) - torch.exp((s.lambda_q2 * s.lambda_k2).sum(-1)) + 0.2
    assert lam.shape == (H,) and (lam[0] - lam[1]).abs() > 0.05  # two heads, two lambdas
    torch.testing.assert_close(s.lambda_full(), lam)
    q, k, v, mask = heads()
    out, w = s(unas, q, k, v, mask)  # defaults: not causal, no dropout
    ref = softmax_by_hand(q[..., :4], k[..., :4], mask) - lam.view(1, H, 1, 1) * softmax_by_hand(q[..., 4:], k[..., 4:], mask)
    torch.testing.assert_close(w, ref)
    o = ref @ v
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-5) * s.subln.weight * (1 - 0.2)
    torch.testing.assert_close(out, o)


@pytest.mark.parametrize("version", [1, 2])
def test_dropout_reaches_the_weights_of_both_versions(version):
    torch.manual_seed(0)
    m = MultiHeadAttention(E, H, spec={"scheme": "diff", "version": version}).double()
    q, k, v, mask = heads()
    query = torch.randn(2, 5, E, dtype=torch.float64)
    plain, _ = m.head_scheme(m.normalizer, q, k, v, mask, query=query)
    torch.manual_seed(1)
    dropped, w = m.head_scheme(m.normalizer, q, k, v, mask, dropout_p=0.5, query=query)
    torch.manual_seed(1)
    from attnlab.attention.schemes.normalizer import apply_weights

    by_hand = apply_weights(w, v, 0.5)  # the same seed drops the same weights
    if version == 1:
        by_hand = m.head_scheme.subln(by_hand) * (1 - m.head_scheme.lambda_init)
    torch.testing.assert_close(dropped, by_hand)
    assert (dropped - plain).abs().max() > 1e-2


@pytest.mark.parametrize("normalization", ["hnas", "stickbreaking"])
def test_the_maps_take_the_normalizations_inputs_and_causality(normalization):
    torch.manual_seed(0)
    causal = normalization == "stickbreaking"  # causal-only: refused unless the call is causal
    m = MultiHeadAttention(E, H, spec={"scheme": "diff", "normalization": normalization, "hybrid_init": 0.3},
                           is_decoder=causal).double()
    q, k, v, mask = heads()
    _, w = m.head_scheme(m.normalizer, q, k, v, mask, causal=causal)
    n = m.normalizer
    w1 = n.attention_weights(q[..., :4], k[..., :4], mask, causal=causal)
    w2 = n.attention_weights(q[..., 4:], k[..., 4:], mask, causal=causal)
    torch.testing.assert_close(w, w1 - m.head_scheme.lambda_full().view(1, -1, 1, 1) * w2)
    if causal:
        with pytest.raises(ConfigError, match="causal attention only"):
            m.head_scheme(n, q, k, v, mask)


def test_the_maps_check_their_inputs_and_refuse_a_causal_query_normalization():
    m = MultiHeadAttention(E, H, spec={"scheme": "diff", "normalization": "dnas"}).double()
    q, k, v, mask = heads()
    with pytest.raises(ConfigError, match="leaks the future"):
        m.head_scheme(m.normalizer, q, k, v, causal=True)
    for version in (1, 2):
        s = MultiHeadAttention(E, H, spec={"scheme": "diff", "version": version}).double()
        query = torch.randn(2, 5, E, dtype=torch.float64)
        with pytest.raises(ConfigError, match=r"^v \(2, 2, 4, 8\) must match k \(2, 2, 5, [48]\) in B, H and S_k$"):
            s.head_scheme(s.normalizer, q, k, v[:, :, :4], query=query)
        for key in ("key_padding_mask", "query_padding_mask"):
            with pytest.raises(ConfigError, match=rf"^{key} must be a bool tensor"):
                s.head_scheme(s.normalizer, q, k, v, query=query, **{key: mask.double()})


def test_v2_projections_and_its_reported_lambda_over_valid_queries():
    torch.manual_seed(0)
    m = MultiHeadAttention(E, H, spec={"scheme": "diff", "version": 2}).double()
    s = m.head_scheme
    assert s.q2_proj.bias is not None and s.lambda_proj.bias is None  # W_lambda: E x H, no bias
    assert s.reported() == {}  # no forward yet
    q, k, v, mask = heads()
    with pytest.raises(ConfigError, match=r"^model=diff model\.version=2 takes its lambda and second query from "
                                          r"the attention's query input, which this attention does not give"):
        s(m.normalizer, q, k, v, mask)
    query = torch.randn(2, 5, E, dtype=torch.float64)
    s(m.normalizer, q, k, v, mask, query_padding_mask=mask, query=query)
    lam = torch.sigmoid(query @ s.lambda_proj.weight.T)  # (B, S, H)
    valid = lam[0].sum(0) + lam[1, :3].sum(0)  # example 1's last two queries are padding
    (reported,) = s.reported().values()
    assert list(s.reported()) == ["lambda"]
    torch.testing.assert_close(reported, (valid / 8).to(reported.dtype))
    # the repr shows v1's lambda_init as computed for its layer (v2 has none)
    assert s.extra_repr() == f"diff, layer_index=0, {s.options}"
    assert MultiHeadAttention(E, H, spec="diff").head_scheme.extra_repr().endswith(", lambda_init=0.2000")


def test_rmsnorm_and_lambda_run_in_float32_for_half_precision_models():
    from attnlab.attention.schemes.diff import RMSNorm

    norm = RMSNorm(8)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(3, 8).to(torch.bfloat16) * 50
    out = norm(x)
    xf = x.float()
    ref = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(torch.bfloat16) * norm.weight.to(torch.bfloat16)
    assert out.dtype == torch.bfloat16 and torch.equal(out, ref)
    m = randomized(MultiHeadAttention(E, H, spec="diff"))
    s = m.head_scheme
    lam32 = s.lambda_full()
    s.to(torch.bfloat16)
    lam = s.lambda_full()
    assert lam.dtype == torch.float32
    # the exponentials in float32 of the bf16 dot products (not exp in bf16: steps of 1/128)
    ref = (torch.exp((s.lambda_q1 * s.lambda_k1).sum(-1).float())
           - torch.exp((s.lambda_q2 * s.lambda_k2).sum(-1).float()) + 0.2)
    torch.testing.assert_close(lam, ref)
    torch.testing.assert_close(lam, lam32, atol=0.02, rtol=0)


def test_lambda_per_names_its_choices():
    with pytest.raises(ConfigError, match=r"^model\.lambda_per='row' must be layer or head$"):
        AttentionSpec("diff", lambda_per="row")


def test_version_2s_second_query_projection_follows_the_modules_bias():
    """`bias=False` reaches diff v2's own projection: no bias anywhere in the module."""
    for bias in (True, False):
        m = MultiHeadAttention(16, 2, spec={"scheme": "diff", "version": 2}, bias=bias)
        assert (m.head_scheme.q2_proj.bias is not None) == bias == (m.q_proj.bias is not None)
        assert any(n.endswith("bias") for n, _ in m.named_parameters()) == bias


def test_only_version_2_needs_the_query_input():
    assert MultiHeadAttention(E, H, spec={"scheme": "diff", "version": 2}).head_scheme.needs_query is True
    assert MultiHeadAttention(E, H, spec="diff").head_scheme.needs_query is False


def test_v2_reports_its_lambda_in_float32_from_a_bf16_model():
    """The sigmoid of x W_lambda is taken in float32 (bf16's steps are 1/128 near 1/2), and
    reported in float32 as every scheme's values."""
    torch.manual_seed(1)
    m = MultiHeadAttention(E, H, spec={"scheme": "diff", "version": 2}).to(torch.bfloat16)
    s = m.head_scheme
    q, k, v, _ = heads(dtype=torch.bfloat16)
    query = torch.randn(2, 5, E).to(torch.bfloat16)
    s(m.normalizer, q, k, v, query=query)
    (reported,) = s.reported().values()
    lam = torch.sigmoid((query @ s.lambda_proj.weight.T).float())  # (B, S, H)
    assert reported.dtype == torch.float32
    torch.testing.assert_close(reported, lam.mean(dim=(0, 1)), atol=1e-6, rtol=0)


def test_v2_rounds_its_second_query_to_the_first_ones_dtype():
    """Under autocast the module's query heads arrive in bf16 and the query input in float32: the
    second query (its own projection, in float32) is rounded to bf16 as the first was, so both
    maps are computed from queries of one precision."""
    torch.manual_seed(2)
    m = MultiHeadAttention(E, H, spec={"scheme": "diff", "version": 2})
    s = m.head_scheme
    q, k, v, _ = heads(dtype=torch.bfloat16)
    query = torch.randn(2, 5, E)
    _, weights = s(m.normalizer, q, k, v, query=query)
    with torch.no_grad():
        q2 = s.q2_proj(query).view(2, 5, H, -1).transpose(1, 2).to(torch.bfloat16)
        w1, w2 = (softmax_by_hand(x.float(), k.float(), torch.zeros(2, 5, dtype=torch.bool)) for x in (q, q2))
        lam = torch.sigmoid(s.lambda_proj(query)).transpose(1, 2)
    torch.testing.assert_close(weights, w1 - lam.unsqueeze(-1) * w2, atol=1e-6, rtol=0)

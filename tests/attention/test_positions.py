"""Positions inside attention (attnlab.attention.positions): RoPE against rotary-embedding-torch,
ALiBi against the paper's slopes and an explicit additive S x S bias (float64, every causal
normalizer of the registry, through its own fast path), its float32 and bfloat16 precision at
S = 4096, decoding with a cache against the full pass, the routes unchanged, and the refusals."""

import math

import pytest
import torch
from rotary_embedding_torch import RotaryEmbedding

from attnlab.attention import (
    DecoderCache,
    MultiHeadAttention,
    TransformerDecoderLayer,
    alibi_slopes,
    rope,
    step_stack,
)
from attnlab.attention.functional import normalizer
from attnlab.attention.kv_cache import KeyValues
from attnlab.attention.positions import ALIBI_MAX_POSITIONS, AttentionPositions
from attnlab.attention.schemes import NORMALIZERS
from attnlab.attention.schemes.tables import fitting
from attnlab.errors import ConfigError

CAUSAL_NORMALIZERS = [n for n in fitting(causal=True) if n in NORMALIZERS]


def additive_alibi(q: torch.Tensor, k: torch.Tensor, slopes, start: int = 0,
                   first_query: int | None = None) -> torch.Tensor:
    """The paper's logits: q.k / sqrt(d) - m_h (i - j), -inf for keys after the query; keys at
    positions start, start + 1, ..., queries from `first_query` (default: the first key's)."""
    first_query = start if first_query is None else first_query
    i = torch.arange(first_query, first_query + q.shape[-2], dtype=q.dtype)
    j = torch.arange(start, start + k.shape[-2], dtype=q.dtype)
    distance = i[:, None] - j[None, :]
    m = torch.tensor(slopes, dtype=q.dtype)[:, None, None]
    logits = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) - m * distance
    return logits.masked_fill(distance < 0, float("-inf"))


# ----------------------------------------------------------------------------- RoPE
def test_rope_is_the_rotary_embedding_torch_rotation_in_float64():
    """rotary-embedding-torch rotates interleaved pairs (2f, 2f+1), GPT-NeoX pairs (f, f + d/2)
    with the same frequencies: the same rotation up to that order of the features."""
    torch.manual_seed(0)
    d, start = 16, 37
    x = torch.randn(2, 3, 11, d, dtype=torch.float64)
    package = RotaryEmbedding(dim=d, theta=10000, cache_if_possible=False).double()
    interleaved = torch.stack([torch.arange(d // 2), torch.arange(d // 2) + d // 2], dim=-1).flatten()
    theirs = package.rotate_queries_or_keys(x[..., interleaved], offset=start)
    ours = rope(x, torch.arange(start, start + 11))
    # the package keeps its frequencies in float32 (its own rounding, ~2e-7 here)
    torch.testing.assert_close(ours[..., interleaved], theirs, rtol=0, atol=1e-6)
    # what it is for: q_i . k_j depends on i - j only
    q, k = x[:, :, :1].expand(-1, -1, 11, -1), x[:, :, 1:2].expand(-1, -1, 11, -1)
    dots = (rope(q, torch.arange(11) + 5) * rope(k, torch.arange(11))).sum(-1)  # i - j = 5
    torch.testing.assert_close(dots, dots[..., :1].expand_as(dots), rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------- ALiBi
def test_alibi_slopes_are_the_papers():
    assert alibi_slopes(8) == [1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, 1 / 128, 1 / 256]
    # not a power of 2: the 8 above, then every other slope of 16 heads (2^-0.5, 2^-1.5, ...)
    expected = [2.0**-h for h in range(1, 9)] + [2.0**-0.5, 2.0**-1.5, 2.0**-2.5, 2.0**-3.5]
    assert alibi_slopes(12) == pytest.approx(expected, rel=1e-15)
    assert alibi_slopes(1) == [2.0**-8]


@pytest.mark.parametrize("scheme", CAUSAL_NORMALIZERS)
def test_alibi_through_each_schemes_fast_path_is_the_papers_additive_bias(scheme):
    """Float64, positions across the 256 boundary of the features' split: the scheme's own
    `attend` (its fast path) on the augmented q and k equals its weights of the explicit
    additive-bias logits, times v."""
    torch.manual_seed(0)
    heads, s, d, start = 4, 24, 8, 240
    q, k, v = (torch.randn(2, heads, s, d, dtype=torch.float64) for _ in range(3))
    positions = AttentionPositions("alibi", heads)
    norm, _ = normalizer(scheme)
    q2, k2 = positions.query(q, start), positions.key(k, start)
    assert q2.shape[-1] == positions.head_dim(d) == d + 6
    call = norm.call(q, k, v, causal=True)
    expected = norm.attend_logits(additive_alibi(q, k, alibi_slopes(heads), start), call)[1]
    torch.testing.assert_close(norm.attend(q2, k2, v, causal=True), expected, rtol=0, atol=1e-10)


def test_alibi_in_groups_biases_each_group_as_a_head_of_its_own():
    """Differential attention v1 splits each head in halves: each half's q.k / sqrt(d/2) gets the
    head's bias."""
    torch.manual_seed(0)
    heads, s, d = 2, 9, 8
    q, k = (torch.randn(1, heads, s, d, dtype=torch.float64) for _ in range(2))
    positions = AttentionPositions("alibi", heads, groups=2)
    q2, k2 = positions.query(q), positions.key(k)
    half = q2.shape[-1] // 2
    for g, (qg, kg) in enumerate(zip(q2.split(half, -1), k2.split(half, -1))):
        logits = qg @ kg.transpose(-2, -1) / math.sqrt(half)
        expected = additive_alibi(q[..., g * d // 2:(g + 1) * d // 2], k[..., g * d // 2:(g + 1) * d // 2],
                                  alibi_slopes(heads))
        torch.testing.assert_close(logits.tril(), expected.nan_to_num(0.0, 0.0, 0.0).tril(), rtol=0, atol=1e-12)


def test_alibi_precision_at_4096_positions_in_float32_and_bfloat16():
    """The bound of the module docstring, 2^-22 m_h S, at S = 4096 (the rows of the last queries,
    where it is largest). In bfloat16 the position features are exact and only c_h rounds: the
    float32 logits of bf16 features equal the bias of the rounded slopes within the same bound."""
    torch.manual_seed(0)
    heads, s, d, rows = 8, 4096, 64, 8
    q, k = torch.randn(1, heads, s, d, dtype=torch.float64), torch.randn(1, heads, s, d, dtype=torch.float64)
    positions = AttentionPositions("alibi", heads)
    slopes = torch.tensor(alibi_slopes(heads), dtype=torch.float64)
    bound = 2.0**-22 * slopes * s
    exact = additive_alibi(q[:, :, -rows:], k, alibi_slopes(heads), first_query=s - rows)
    valid = torch.isfinite(exact)

    def logits(q2, k2):
        return (q2[:, :, -rows:].float() @ k2.float().transpose(-2, -1) / math.sqrt(d + 6)).double()

    error = (logits(positions.query(q.float()), positions.key(k.float())) - exact).abs()
    assert (error.where(valid, 0.0).amax(dim=(0, 2, 3)) <= bound).all()
    assert error.where(valid, 0.0).amax() > 1e-5  # the bias's rounding shows: the bound is not idle

    qb, kb = positions.query(q.bfloat16()), positions.key(k.bfloat16())
    # every position feature exactly as in float64
    torch.testing.assert_close(kb[..., d:d + 3].double(), positions.key(k)[..., d:d + 3], rtol=0, atol=0)
    # the reference with the same bf16 rounding of q, k and c_h = sqrt(d') m_h
    c = torch.tensor([math.sqrt(d + 6) * m for m in alibi_slopes(heads)]).bfloat16().double()
    last = q[:, :, -rows:].bfloat16()
    rounded = ((last * math.sqrt((d + 6) / d)).double() @ k.bfloat16().double().transpose(-2, -1)
               / math.sqrt(d + 6))
    i = torch.arange(s, dtype=torch.float64)
    rounded = rounded - (c / math.sqrt(d + 6))[:, None, None] * (i[-rows:, None] - i[None, :])
    error = (logits(qb, kb) - rounded).abs()
    assert (error.where(valid, 0.0).amax(dim=(0, 2, 3)) <= bound).all()
    assert ((c / math.sqrt(d + 6) / slopes - 1).abs() <= 2.0**-8).all()  # the slope, within 0.4 %


@pytest.mark.parametrize(("scheme", "d"), [("rope", 64), ("alibi", 64), ("alibi", 128)])
def test_every_causal_kernel_serves_the_positions_at_4096(scheme, d):
    """12 heads (the largest slope, 2^-0.5): every causal normalizer runs a fast path on the
    rotated / augmented heads (none falls to its S x S reference). RoPE keeps the plain route;
    ALiBi's q and k are wider than v, which ATen's flash kernel refuses (its math kernel would
    materialize the scores): those calls go to a kernel that takes any value width (UNAS and
    SSMax: the row-wise kernel's softmax)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 12, 4096, d) for _ in range(3))
    positions = AttentionPositions(scheme, 12)
    q2, k2 = positions.query(q), positions.key(k)
    for name in CAUSAL_NORMALIZERS:
        norm, inputs = normalizer(name)
        plain = norm.choose(norm.call(q, k, v, causal=True, **inputs))
        moved = norm.choose(norm.call(q2, k2, v, causal=True, **inputs))
        assert plain is not None and moved is not None, name
        if scheme == "rope":
            assert moved.name == plain.name, name
        else:
            assert moved.any_value_width, (name, moved.name)


# ----------------------------------------------------------------------------- in the module
@pytest.mark.parametrize("scheme", ["rope", "alibi"])
def test_decoding_with_the_cache_equals_the_full_pass_in_float64(scheme):
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, "unas", is_decoder=True, positions=scheme).double().eval()
    x = torch.randn(2, 13, 16, dtype=torch.float64)
    with torch.no_grad():
        full = mha(x, causal=True)
        cache = KeyValues()
        steps = torch.cat([mha.step(x[:, t:t + 1], cache)[0] for t in range(13)], dim=1)
        later = mha(x[:, 5:], causal=True, start=5)  # a window that starts at position 5
    torch.testing.assert_close(steps, full, rtol=0, atol=1e-12)
    assert cache.keys.shape[-1] == mha.positions.head_dim(4)  # keys cached as attention uses them
    if scheme == "rope":  # relative: the window attends as it would from position 0
        torch.testing.assert_close(later, mha(x[:, 5:], causal=True), rtol=0, atol=1e-12)


def test_the_positions_are_refused_where_they_cannot_act():
    with pytest.raises(ConfigError, match="positions='learned'.*none, rope, alibi"):
        MultiHeadAttention(16, 4, positions="learned")
    mha = MultiHeadAttention(16, 4, positions="alibi")
    with pytest.raises(ConfigError, match="alibi biases causal self-attention"):
        mha(torch.randn(1, 3, 16))
    with pytest.raises(ConfigError, match=f"at most {ALIBI_MAX_POSITIONS} positions"):
        mha(torch.randn(1, 3, 16), causal=True, start=ALIBI_MAX_POSITIONS - 2)
    with pytest.raises(ConfigError, match="head size is 5"):
        MultiHeadAttention(10, 2, positions="rope")(torch.randn(1, 3, 10), causal=True)
    with pytest.raises(ConfigError, match="model=diff.*projects queries of its own"):
        MultiHeadAttention(16, 2, {"scheme": "diff", "version": 2}, is_decoder=True, positions="rope")


@pytest.mark.parametrize("scheme", ["rope", "alibi"])
def test_a_decoder_layer_steps_with_positions_in_its_self_attention(scheme):
    """TransformerDecoderLayer(positions=...): the self-attention only (the source's positions
    are the encoder's); its cached steps equal the forward."""
    torch.manual_seed(0)
    layer = TransformerDecoderLayer(16, 2, 32, dropout=0.0, positions=scheme).double().eval()
    assert layer.cross_attn.positions.scheme == "none"
    x, memory = torch.randn(2, 7, 16, dtype=torch.float64), torch.randn(2, 5, 16, dtype=torch.float64)
    with torch.no_grad():
        full = layer(x, memory)
        cache = DecoderCache.start([layer], memory)
        steps = torch.cat([step_stack([layer], x[:, t:t + 1], cache) for t in range(7)], dim=1)
    torch.testing.assert_close(steps, full, rtol=0, atol=1e-12)

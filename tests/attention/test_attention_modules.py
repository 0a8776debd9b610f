"""MultiHeadAttention, the Transformer layers and attention_modules."""

from __future__ import annotations

import math
from unittest import mock

import pytest
import torch
from torch import nn

from attnlab.attention import (
    AttentionSpec,
    MultiHeadAttention,
    TransformerDecoderLayer,
    TransformerEncoderLayer,
    attend,
    attention_modules,
    attention_weights,
    record_attention,
    scheme_values,
)
from attnlab.attention.schemes import NORMALIZERS
from attnlab.errors import ConfigError

E, H = 16, 4


def padding(B, S, lengths):
    return torch.arange(S)[None, :] >= torch.tensor(lengths)[:, None]


def split(x, heads=H):
    B, S, F = x.shape
    return x.view(B, S, heads, F // heads).transpose(1, 2)


def test_unas_mha_equals_torch_multihead_attention():
    torch.manual_seed(0)
    ours = MultiHeadAttention(E, H, spec="unas").eval()
    ref = nn.MultiheadAttention(E, H, batch_first=True).eval()
    with torch.no_grad():  # head h = rows [h*d:(h+1)*d] of each projection, as in torch / BERT
        ref.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
        ref.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        ref.out_proj.load_state_dict(ours.out_proj.state_dict())
    x, mem = torch.randn(2, 5, E), torch.randn(2, 7, E)
    kpm = padding(2, 7, [7, 4])
    torch.testing.assert_close(ours(x), ref(x, x, x, need_weights=False)[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(
        ours(x, mem, key_padding_mask=kpm), ref(x, mem, mem, key_padding_mask=kpm)[0], atol=1e-5, rtol=0
    )


@pytest.mark.parametrize("scheme", sorted(NORMALIZERS))
def test_mha_is_projections_around_attend(scheme):
    torch.manual_seed(1)
    mha = MultiHeadAttention(E, H, spec={"scheme": scheme, "n_iter": 3, "hybrid_init": 0.3}).eval()
    x, mem = torch.randn(2, 5, E), torch.randn(2, 6, E)
    kpm, qpm = padding(2, 6, [6, 3]), padding(2, 5, [4, 5])
    causal = NORMALIZERS[scheme].causal_only  # stick-breaking: causal attention only
    out = mha(x, mem, key_padding_mask=kpm, query_padding_mask=qpm, causal=causal)
    assert out.shape == (2, 5, E)
    q, k, v = split(mha.q_proj(x)), split(mha.k_proj(mem)), split(mha.v_proj(mem))
    u = torch.full((1, H, 1, 1), 0.3) if scheme == "hnas" else None
    heads = attend(q, k, v, scheme, key_padding_mask=kpm, query_padding_mask=qpm, causal=causal,
                   u=u, n_iter=3)
    expected = mha.out_proj(heads.transpose(1, 2).reshape(2, 5, E))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_project_values_false_attends_raw_values():
    torch.manual_seed(2)
    mha = MultiHeadAttention(E, H, spec="dnas", vdim=8, project_values=False)
    assert mha.v_proj is None and mha.out_proj is None
    x, mem, feats = torch.randn(2, 5, E), torch.randn(2, 3, E), torch.randn(2, 3, 8)
    out = mha(x, mem, feats)
    assert out.shape == (2, 5, 8)
    heads = attend(split(mha.q_proj(x)), split(mha.k_proj(mem)), split(feats), "dnas")
    torch.testing.assert_close(out, heads.transpose(1, 2).reshape(2, 5, 8), atol=1e-6, rtol=0)
    with pytest.raises(ConfigError, match="vdim"):
        MultiHeadAttention(E, H, vdim=6, project_values=False)


def test_hybrid_u_parameter_and_endpoints():
    torch.manual_seed(3)
    per_head = MultiHeadAttention(E, H, spec={"scheme": "hnas", "hybrid_init": 0.1})
    assert per_head.normalizer.hybrid_logit.shape == (H,)
    torch.testing.assert_close(per_head.normalizer.u, torch.full((H,), 0.1))
    assert not per_head.normalizer.u.requires_grad
    per_layer = MultiHeadAttention(E, H, spec=AttentionSpec("hnas", hybrid_init=0.5, hybrid_per="layer"))
    assert per_layer.normalizer.hybrid_logit.shape == (1,) and per_layer.normalizer.u.shape == (H,)
    assert scheme_values(MultiHeadAttention(E, H, spec="dnas")) == {}
    # init 0 / 1 are clamped so the logit is finite ...
    for init in (0.0, 1.0):
        m = MultiHeadAttention(E, H, spec={"scheme": "hnas", "hybrid_init": init})
        logit = m.normalizer.hybrid_logit
        assert torch.isfinite(logit).all() and (m.normalizer.u - init).abs().max() <= 1.01e-4
    # ... and the module output at the endpoints equals UNAS / DNAS with the same weights.
    x, kpm = torch.randn(2, 5, E), padding(2, 5, [5, 3])
    for init, scheme in ((0.0, "unas"), (1.0, "dnas")):
        hybrid = MultiHeadAttention(E, H, spec={"scheme": "hnas", "hybrid_init": init})
        plain = MultiHeadAttention(E, H, spec=scheme)
        plain.load_state_dict(hybrid.state_dict(), strict=False)
        got = hybrid(x, key_padding_mask=kpm, query_padding_mask=kpm)
        want = plain(x, key_padding_mask=kpm, query_padding_mask=kpm)
        torch.testing.assert_close(got, want, atol=1e-3, rtol=0)
    # u is trained: it receives a gradient
    per_head(x).sum().backward()
    grad = per_head.normalizer.hybrid_logit.grad
    assert grad is not None and grad.abs().sum() > 0


def test_recording_happens_only_inside_a_recorder_and_nests():
    torch.manual_seed(4)
    mha = MultiHeadAttention(E, H, spec="dnas")
    x, kpm = torch.randn(2, 5, E), padding(2, 5, [5, 2])
    with mock.patch.object(mha.normalizer, "attention_weights", wraps=mha.normalizer.attention_weights) as spy:
        mha(x, key_padding_mask=kpm, query_padding_mask=kpm)
        assert spy.call_count == 0  # nothing is materialized without a recorder
        with record_attention(mha.named_modules()) as outer:
            with record_attention([mha]) as inner:
                mha(x, key_padding_mask=kpm, query_padding_mask=kpm)
                mha(2 * x, key_padding_mask=kpm, query_padding_mask=kpm)  # not kept: first only
            assert spy.call_count == 1  # computed once for both owners
            mha(x, key_padding_mask=kpm, query_padding_mask=kpm)  # the outer one stays open
        assert not mha._recorders
    rec = inner.records["0"]
    assert outer.records[""] is rec
    w = rec.weights
    assert w.shape == (2, H, 5, 5) and w.dtype == torch.float32 and not w.requires_grad
    expected = attention_weights(split(mha.q_proj(x)), split(mha.k_proj(x)), "dnas",
                                 key_padding_mask=kpm, query_padding_mask=kpm)
    torch.testing.assert_close(w, expected)
    assert rec.key_padding_mask is kpm and rec.query_padding_mask is kpm
    torch.testing.assert_close(rec.column_sums, w.sum(-2))
    assert rec.head_outputs.shape == (2, H, 5, E // H)
    everything = record_attention([mha], first_only=False)
    with everything:
        mha(x)
        mha(x)
    assert len(everything.records["0"]) == 2


def test_decoder_guard_refuses_query_normalized_schemes():
    for scheme in ("dnas", "hnas", "sinkhorn"):
        with pytest.raises(ConfigError, match="model=unas"):
            MultiHeadAttention(E, H, spec=scheme, is_decoder=True)
        with pytest.raises(ConfigError, match="model=unas"):
            TransformerDecoderLayer(E, H, 32, spec=scheme)
    MultiHeadAttention(E, H, spec="unas", is_decoder=True)  # fine
    with pytest.raises(ValueError, match="unas"):
        MultiHeadAttention(E, H, spec="dnas")(torch.randn(1, 3, E), causal=True)


def test_attention_modules_in_named_modules_order():
    model = nn.ModuleDict({
        "enc": nn.ModuleList([TransformerEncoderLayer(E, H, 32, spec="hnas") for _ in range(2)]),
        "dec": TransformerDecoderLayer(E, H, 32),
    })
    names = [name for name, _ in attention_modules(model)]
    assert names == ["enc.0.self_attn", "enc.1.self_attn", "dec.self_attn", "dec.cross_attn"]
    assert [m.scheme for _, m in attention_modules(model)] == ["hnas", "hnas", "unas", "unas"]


def test_encoder_layer_equals_hf_bert_layer():
    transformers = pytest.importorskip("transformers")
    from transformers.models.bert.modeling_bert import BertLayer

    torch.manual_seed(5)
    cfg = transformers.BertConfig(hidden_size=E, num_attention_heads=H, intermediate_size=32,
                                  hidden_act="gelu", layer_norm_eps=1e-12)
    cfg._attn_implementation = "eager"
    bert = BertLayer(cfg).eval()
    ours = TransformerEncoderLayer(E, H, 32, dropout=0.1, spec="unas").eval()
    mapping = {
        "attention.self.query": "self_attn.q_proj", "attention.self.key": "self_attn.k_proj",
        "attention.self.value": "self_attn.v_proj", "attention.output.dense": "self_attn.out_proj",
        "attention.output.LayerNorm": "norm1", "intermediate.dense": "linear1",
        "output.dense": "linear2", "output.LayerNorm": "norm2",
    }
    state = {}
    for name, tensor in bert.state_dict().items():
        prefix, leaf = name.rsplit(".", 1)
        state[f"{mapping[prefix]}.{leaf}"] = tensor
    ours.load_state_dict(state)  # strict: the two layers have exactly the same parameters
    x = torch.randn(2, 6, E)
    kpm = padding(2, 6, [6, 4])
    ext = torch.zeros(2, 1, 1, 6).masked_fill(kpm[:, None, None, :], torch.finfo(torch.float32).min)
    want = bert(x, attention_mask=ext)
    want = want[0] if isinstance(want, tuple) else want
    got = ours(x, key_padding_mask=kpm)
    valid = ~kpm
    torch.testing.assert_close(got[valid], want[valid], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("scheme", ["unas", "dnas", "hnas"])
def test_encoder_padding_does_not_leak(scheme, norm_first):
    """Changing padded positions changes no valid output (DNAS: padded queries not in c)."""
    torch.manual_seed(6)
    layer = TransformerEncoderLayer(E, H, 32, spec=scheme, norm_first=norm_first).eval()
    x = torch.randn(2, 6, E)
    kpm = padding(2, 6, [6, 3])
    y = x.clone()
    y[1, 3:] = 100 * torch.randn(3, E)
    torch.testing.assert_close(layer(x, kpm)[~kpm], layer(y, kpm)[~kpm], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_is_causal(norm_first):
    torch.manual_seed(7)
    layer = TransformerDecoderLayer(E, H, 32, norm_first=norm_first).eval()
    x, mem = torch.randn(2, 6, E), torch.randn(2, 4, E)
    mem_pad = padding(2, 4, [4, 2])
    out = layer(x, mem, memory_key_padding_mask=mem_pad)
    assert out.shape == (2, 6, E)
    y = x.clone()
    y[:, 4:] = torch.randn(2, 2, E)  # change the future
    out2 = layer(y, mem, memory_key_padding_mask=mem_pad)
    torch.testing.assert_close(out[:, :4], out2[:, :4], atol=1e-6, rtol=0)
    assert not torch.allclose(out[:, 4:], out2[:, 4:])
    # padded memory is ignored
    mem2 = mem.clone()
    mem2[1, 2:] = 50.0
    torch.testing.assert_close(layer(x, mem2, memory_key_padding_mask=mem_pad), out, atol=1e-6, rtol=0)


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
def test_attention_dropout_in_training(scheme):
    torch.manual_seed(8)
    mha = MultiHeadAttention(E, H, spec=scheme, dropout=0.5)
    x = torch.randn(2, 5, E)
    mha.train()
    a, b = mha(x), mha(x)
    assert not torch.allclose(a, b)  # weights are dropped at random
    (a.sum() + b.sum()).backward()
    assert all(torch.isfinite(p.grad).all() for p in mha.parameters() if p.grad is not None)
    mha.eval()
    torch.testing.assert_close(mha(x), mha(x))


def test_bad_configuration_messages():
    with pytest.raises(ConfigError, match="divisible"):
        MultiHeadAttention(10, 3)
    with pytest.raises(ConfigError, match="activation"):
        TransformerEncoderLayer(E, H, activation="swish")
    with pytest.raises(ConfigError, match="unknown attention scheme"):
        MultiHeadAttention(E, H, spec="coda-typo")
    assert math.isclose(MultiHeadAttention(E, H, spec="hnas").normalizer.u.mean().item(), 0.5, rel_tol=1e-6)

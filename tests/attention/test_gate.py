"""model.gate: the gated attention output of Qiu et al. 2025 on any scheme (attention/gate.py)."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.attention import (
    AttentionSpec,
    MultiHeadAttention,
    OutputGate,
    TransformerEncoderLayer,
    attend,
    scheme_values,
)
from attnlab.attention.schemes import NORMALIZERS
from attnlab.errors import ConfigError

E, H = 12, 3
D = E // H


def padded(batch=2, S=5, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, S, E, generator=g, dtype=dtype)
    mask = torch.zeros(batch, S, dtype=torch.bool)
    mask[1, -2:] = True
    return x, mask


def authors_forward(x, mask, q_fused, b_fused, k_proj, v_proj, o_proj, kind):
    """A re-statement of the published Qwen3 attention with an output gate (qiuzh20/gated_attention,
    modeling_qwen3.py), MHA (one query head per key head), no RoPE or qk-norm: q_proj has per
    head its d query columns then its gate columns (1 headwise, d elementwise); the gate scores
    are split off, and sigmoid(gate) multiplies the attention output before o_proj."""
    bsz, q_len, _ = x.shape
    states = x @ q_fused.T + b_fused
    states = states.view(bsz, q_len, H, -1)  # num_key_value_heads = H
    width = 1 if kind == "headwise" else D
    query, gate_score = torch.split(states, [D, width], dim=-1)
    query = query.transpose(1, 2)
    key = k_proj(x).view(bsz, q_len, H, D).transpose(1, 2)
    value = v_proj(x).view(bsz, q_len, H, D).transpose(1, 2)
    scores = query @ key.transpose(2, 3) / math.sqrt(D)
    scores = scores + torch.where(mask, float("-inf"), 0.0).to(scores.dtype)[:, None, None, :]
    attn = torch.softmax(scores, dim=-1) @ value
    attn = attn.transpose(1, 2) * torch.sigmoid(gate_score)
    return o_proj(attn.reshape(bsz, q_len, -1))


def fused_q(m: MultiHeadAttention):
    """Our q_proj and gate.proj as the authors' one q_proj (rows per head: query, then gate)."""
    width = m.gate.proj.out_features // H
    wq, wg = m.q_proj.weight.view(H, D, E), m.gate.proj.weight.view(H, width, E)
    bq, bg = m.q_proj.bias.view(H, D), m.gate.proj.bias.view(H, width)
    return torch.cat([wq, wg], 1).reshape(-1, E), torch.cat([bq, bg], 1).reshape(-1)


@pytest.mark.parametrize("kind", ["headwise", "elementwise"])
def test_gate_matches_the_published_formula_values_and_gradients(kind):
    torch.manual_seed(0)
    m = MultiHeadAttention(E, H, spec={"scheme": "unas", "gate": kind}).double()
    with torch.no_grad():  # gates away from 0.5, so that a wrong gate cannot pass by luck
        m.gate.proj.weight.normal_(0, 0.5)
        m.gate.proj.bias.normal_(0, 1.0)
    x, mask = padded()
    x1 = x.clone().requires_grad_(True)
    ours = m(x1, key_padding_mask=mask)
    g_ours = torch.autograd.grad(ours.pow(2).sum(), [x1, m.q_proj.weight, m.gate.proj.weight])

    q_fused, b_fused = (t.detach().clone().requires_grad_(True) for t in fused_q(m))
    x2 = x.clone().requires_grad_(True)
    theirs = authors_forward(x2, mask, q_fused, b_fused, m.k_proj, m.v_proj, m.out_proj, kind)
    gx, gq = torch.autograd.grad(theirs.pow(2).sum(), [x2, q_fused])
    width = 1 if kind == "headwise" else D
    gq = gq.view(H, D + width, E)

    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(g_ours[0], gx)
    torch.testing.assert_close(g_ours[1], gq[:, :D].reshape(E, E))
    torch.testing.assert_close(g_ours[2], gq[:, D:].reshape(-1, E))


def test_gate_initialization_is_the_published_one():
    """Weights N(0, 0.02), bias 0: every gate starts near sigmoid(0) = 0.5."""
    torch.manual_seed(0)
    gate = OutputGate("elementwise", 256, 4, 64)
    assert abs(gate.proj.weight.std().item() - 0.02) < 2e-3 and gate.proj.bias.abs().max() == 0
    x = torch.randn(4, 8, 256)
    assert (gate.gates(x) - 0.5).abs().max() < 0.4  # logits ~ N(0, (0.02 * 16)^2)
    assert abs(gate.gates(x).mean().item() - 0.5) < 0.01


@pytest.mark.parametrize("kind", ["headwise", "elementwise"])
def test_dnas_with_a_gate_trains_under_padding(kind):
    torch.manual_seed(0)
    layer = TransformerEncoderLayer(E, H, 24, 0.1, spec={"scheme": "dnas", "gate": kind})
    x, mask = padded(dtype=torch.float32)
    x.requires_grad_(True)
    out = layer(x, key_padding_mask=mask)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
    grads = {n: p.grad for n, p in layer.named_parameters()}
    assert grads["self_attn.gate.proj.weight"] is not None
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())


def test_gate_off_is_todays_module():
    """model.gate=null: the same parameters, state dict keys and outputs as without the key."""
    torch.manual_seed(0)
    plain = MultiHeadAttention(E, H, spec="dnas")
    torch.manual_seed(0)
    off = MultiHeadAttention(E, H, spec={"scheme": "dnas", "gate": None})
    assert off.gate is None
    assert list(off.state_dict()) == list(plain.state_dict()) == [
        f"{p}_proj.{w}" for p in "qkv" for w in ("weight", "bias")] + ["out_proj.weight", "out_proj.bias"]
    x, mask = padded(dtype=torch.float32)
    torch.testing.assert_close(off(x, key_padding_mask=mask), plain(x, key_padding_mask=mask),
                               rtol=0, atol=0)
    assert AttentionSpec.from_config({"scheme": "dnas", "gate": None}).to_dict() == \
        AttentionSpec("dnas").to_dict()


def test_reported_values_and_scheme_values():
    torch.manual_seed(0)
    layers = torch.nn.ModuleList(
        TransformerEncoderLayer(E, H, 24, 0.0, spec={"scheme": "hnas", "gate": "headwise"}) for _ in range(2))
    assert "gate_mean" not in scheme_values(layers)  # nothing seen yet
    with torch.no_grad():
        layers[1].self_attn.gate.proj.bias[:] = torch.tensor([-10.0, 0.0, 10.0])
    x, mask = padded(dtype=torch.float32)
    for layer in layers:
        x = layer(x, key_padding_mask=mask)
    values = scheme_values(layers)
    assert list(values["gate_mean"]) == ["0.self_attn", "1.self_attn"]
    assert values["hnas_u"]  # the scheme's own are still there
    closed = values["gate_closed"]["1.self_attn"]
    torch.testing.assert_close(closed, torch.tensor([1.0, 0.0, 0.0]))
    # the mean over the valid query positions, recomputed
    gate = layers[0].self_attn.gate
    inputs = padded(dtype=torch.float32)[0]
    g = gate.gates(inputs).detach()[..., 0]  # (B, H, S)
    valid = ~mask
    expected = torch.stack([g[:, h][valid].mean() for h in range(H)])
    torch.testing.assert_close(values["gate_mean"]["0.self_attn"], expected)
    assert values["gate_mean"]["0.self_attn"].shape == (H,)


def test_gate_validation_spec_and_where_it_applies():
    with pytest.raises(ConfigError, match=r"model\.gate='rowwise': choose model\.gate=headwise, "
                                          r"model\.gate=elementwise or model\.gate=null"):
        AttentionSpec("unas", gate="rowwise")
    spec = AttentionSpec.from_config({"scheme": "coda", "gate": "Headwise"})
    assert spec.to_dict()["gate"] == "headwise" and AttentionSpec.from_config(spec.to_dict()) == spec
    # a decoder keeps the model's gate, also where it falls back to unas
    assert AttentionSpec("dnas", gate="elementwise").for_decoder().to_dict() == \
        {"scheme": "unas", "decoder": True, "gate": "elementwise"}
    # no output projection (VQA's fusion, classify's hops): the gate gates the heads returned
    raw = MultiHeadAttention(E, H, spec={"scheme": "dnas", "gate": "headwise"}, vdim=2 * H,
                             project_values=False)
    x, feats = torch.randn(2, 5, E), torch.randn(2, 3, 2 * H)
    heads = attend(raw._split(raw.q_proj(x)), raw._split(raw.k_proj(x[:, :3])),
                   feats.view(2, 3, H, 2).transpose(1, 2), "dnas")
    gated = heads * raw.gate.gates(x)
    torch.testing.assert_close(raw(x, x[:, :3], feats), gated.transpose(1, 2).reshape(2, 5, 2 * H))
    from attnlab.hf.adapter import SchemeAttention

    with pytest.raises(ConfigError, match="model.gate=headwise needs parameters of its own"):
        SchemeAttention(spec, H, D)


def test_gate_in_incremental_decoding_equals_the_forward():
    from attnlab.attention import KVCache

    torch.manual_seed(0)
    layers = torch.nn.ModuleList(TransformerEncoderLayer(E, H, 24, 0.0, spec={"scheme": "unas", "gate": "elementwise"},
                                                         causal=True) for _ in range(2)).eval()
    x = torch.randn(2, 4, E)
    full = x
    for layer in layers:
        full = layer(full)
    cache = KVCache()
    for t in range(4):
        h = x[:, t:t + 1]
        for i, layer in enumerate(layers):
            h = layer.step(h, cache, i)
    torch.testing.assert_close(h[:, 0], full[:, -1], atol=1e-5, rtol=1e-5)


def test_probe_runs_with_a_gate(tmp_path, data_dir):
    from helpers.cards import TINY
    from helpers.cli import QUIET, metrics_files, run_here

    run_here(["task=probe", "model=dnas", "model.gate=headwise", "debug=fast", "callbacks=minimal",
              *TINY["probe"], *QUIET], tmp_path, data_dir)
    (record,) = metrics_files(tmp_path / "outputs")
    assert record["status"] == "ok" and record["scheme_params"]["gate_mean"]


@pytest.mark.parametrize("scheme", sorted(NORMALIZERS))
def test_every_normalizer_takes_a_gate(scheme):
    """model.gate composes with every scheme: forward and backward under padding, no NaN, the
    gate's parameters trained and its values reported."""
    torch.manual_seed(0)
    m = MultiHeadAttention(E, H, spec={"scheme": scheme, "gate": "elementwise"})
    x = torch.randn(3, 7, E, requires_grad=True)
    kpm = torch.tensor([[False] * 7, [False] * 4 + [True] * 3, [True] * 7])
    causal = NORMALIZERS[scheme].causal_only  # stick-breaking: causal attention only
    out = m(x, key_padding_mask=kpm, query_padding_mask=kpm, causal=causal)
    out.square().sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
    assert m.gate.proj.weight.grad is not None and torch.isfinite(m.gate.proj.weight.grad).all()
    assert set(m.gate.reported()) == {"mean", "closed"}

"""CODA / coda_cs / RealFormer: the cascade of logits within a stack, against hand-written formulas."""

import copy
import math

import pytest
import torch
from torch import nn

from attnlab.attention import (
    AttentionSpec,
    MultiHeadAttention,
    TransformerDecoderLayer,
    TransformerEncoderLayer,
    attention_modules,
    link_stack,
)
from attnlab.attention.cascade import HeadMixer
from attnlab.errors import ConfigError

D, H = 16, 4


def coda(**options):
    return AttentionSpec.from_config({"scheme": "coda", **options})


def encoder(spec, n=3, dropout=0.0):
    torch.manual_seed(0)
    return nn.ModuleList(TransformerEncoderLayer(D, H, 32, dropout, spec=spec) for _ in range(n))


def run(layers, x, mask=None):
    for layer in layers:
        x = layer(x, key_padding_mask=mask)
    return x


def padding(batch, length, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, length + 1, (batch,), generator=g)
    lengths[0] = length
    return torch.arange(length)[None, :] >= lengths[:, None]


def scores(module, x):
    q, k = module._split(module.q_proj(x)), module._split(module.k_proj(x))
    return q @ k.transpose(-2, -1) / math.sqrt(module.head_dim)


def test_eval_is_deterministic_and_training_is_stochastic():
    layers = encoder(coda())
    x, mask = torch.randn(3, 7, D), padding(3, 7)
    layers.eval()
    assert torch.equal(run(layers, x, mask), run(layers, x, mask))
    layers.train()
    a, b = run(layers, x, mask), run(layers, x, mask)
    assert (a - b).abs().max() > 1e-3
    # the noise is the only randomness: the same seed gives the same training forward
    torch.manual_seed(5)
    a = run(layers, x, mask)
    torch.manual_seed(5)
    assert torch.equal(a, run(layers, x, mask))


@pytest.mark.parametrize("scheme", ["coda", "realformer"])
def test_first_layer_without_noise_is_unas(scheme):
    spec = AttentionSpec.from_config({"scheme": scheme, "noise": False})
    torch.manual_seed(1)
    first = MultiHeadAttention(D, H, spec=spec)
    plain = MultiHeadAttention(D, H, spec="unas")
    plain.load_state_dict(first.state_dict())
    x, mask = torch.randn(2, 6, D), padding(2, 6, seed=3)
    for m in (first, plain):
        m.train()  # training mode: only the noise could make them differ
    out = first(x, key_padding_mask=mask, query_padding_mask=mask)
    ref = plain(x, key_padding_mask=mask, query_padding_mask=mask)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("prev_residual", [True, False])
def test_second_layer_follows_the_cascade_formula(prev_residual):
    layers = encoder(coda(noise=False, prev_residual=prev_residual), n=2)
    first, second = layers[0].self_attn, layers[1].self_attn
    assert first.cascade.feeds and second.cascade.source.module is first
    assert isinstance(second.cascade_mixer, HeadMixer) and not hasattr(first, "cascade_mixer")
    x = torch.randn(2, 5, D)
    for m in (first, second):
        m.record = True
    run(layers.eval(), x)
    h = layers[0](x)  # the second layer's input
    c1, c2 = scores(first, x), scores(second, h)
    mixed = second.cascade_mixer.net((c1 + c2).movedim(1, -1)).movedim(-1, 1)
    z2 = c2 + mixed + (c1 if prev_residual else 0)
    torch.testing.assert_close(second.recorded["weights"], torch.softmax(z2, -1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(first.recorded["weights"], torch.softmax(c1, -1), atol=1e-5, rtol=1e-5)


def test_realformer_adds_the_logits_of_all_previous_layers():
    layers = encoder(AttentionSpec.from_config("realformer"), n=3)
    x = torch.randn(2, 5, D)
    mods = [layer.self_attn for layer in layers]
    for m in mods:
        m.record = True
    run(layers.eval(), x)
    h1 = layers[0](x)
    h2 = layers[1](h1)
    c = [scores(mods[0], x), scores(mods[1], h1), scores(mods[2], h2)]
    assert not any(hasattr(m, "cascade_mixer") for m in mods)  # deterministic, no parameters
    torch.testing.assert_close(mods[2].recorded["weights"], torch.softmax(c[0] + c[1] + c[2], -1),
                               atol=1e-5, rtol=1e-5)


def test_coda_cs_does_not_cascade():
    layers = encoder(AttentionSpec.from_config({"scheme": "coda", "cascade": False}), n=2)
    assert all(m.cascade.source is None and not m.cascade.feeds for _, m in attention_modules(layers))
    assert not any("cascade_mixer" in n for n, _ in layers.named_parameters())


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("spec", [coda(), coda(normalization="dnas"), coda(normalization="hnas"),
                                  AttentionSpec.from_config("realformer")])
def test_padding_gets_no_weight_and_nothing_is_nan(spec, training):
    layers = encoder(spec, n=3, dropout=0.0).train(training)
    for _, m in attention_modules(layers):
        m.record = True
    x = torch.randn(4, 9, D, requires_grad=True)
    mask = padding(4, 9, seed=7)
    mask[3] = True  # one example is all padding
    out = run(layers, x, mask)
    out.square().sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in layers.parameters() if p.grad is not None)
    for _, m in attention_modules(layers):
        w = m.recorded["weights"]
        assert torch.isfinite(w).all()
        assert w.masked_select(mask[:, None, None, :].expand_as(w)).abs().max() == 0  # padded keys
        assert w.masked_select(mask[:, None, :, None].expand_as(w)).abs().max() == 0  # padded queries
        rows = w.sum(-1)[~mask[:, None, :].expand(-1, H, -1)]
        torch.testing.assert_close(rows, torch.ones_like(rows), atol=1e-5, rtol=0)
        if spec.normalization == "dnas":  # the DNAS lemma holds on the cascaded logits too
            s_valid = (~mask).sum(-1)[:3, None].float()
            assert (m.recorded["min_column_sum"][:3] * s_valid >= 1 - 1e-4).all()


def test_decoder_stacks_are_causal_and_match_step_by_step_decoding():
    torch.manual_seed(0)
    spec = coda()
    layers = nn.ModuleList(TransformerDecoderLayer(D, H, 32, 0.0, spec=spec) for _ in range(3)).eval()
    self_mods = [layer.self_attn for layer in layers]
    cross_mods = [layer.cross_attn for layer in layers]
    assert [m.role for m in cross_mods] == ["cross"] * 3 and self_mods[0].role == "decoder"
    assert cross_mods[1].cascade.source.module is cross_mods[0]  # cross cascades into cross
    assert self_mods[1].cascade.source.module is self_mods[0]
    memory, mem_mask = torch.randn(2, 6, D), padding(2, 6, seed=2)
    y = torch.randn(2, 5, D)

    def decode(prefix):
        for layer in layers:
            prefix = layer(prefix, memory, memory_key_padding_mask=mem_mask)
        return prefix

    full = decode(y)
    for t in range(1, 6):  # re-running on a prefix, as beam search does, gives the same states
        torch.testing.assert_close(decode(y[:, :t]), full[:, :t], atol=1e-5, rtol=1e-5)


def test_query_normalization_is_refused_in_decoders_only():
    with pytest.raises(ConfigError, match="decoder"):
        MultiHeadAttention(D, H, spec=coda(normalization="dnas"), is_decoder=True)
    with pytest.raises(ConfigError, match="decoder"):
        TransformerDecoderLayer(D, H, 32, spec=coda(normalization="hnas"))
    m = MultiHeadAttention(D, H, spec=coda(normalization="hnas"))
    assert m.hybrid_u is not None and m.hybrid_u.shape == (H,)
    # a task's decoder gets the cascade scheme with UNAS; other schemes keep the task's decoder
    dec = coda(normalization="dnas").for_decoder("unas")
    assert dec.scheme == "coda" and dec.normalization == "unas"
    assert AttentionSpec.from_config("hnas").for_decoder("unas").scheme == "unas"
    assert coda(decoder=False).for_decoder("unas").scheme == "unas"
    assert coda().for_decoder("dnas").scheme == "dnas"  # an explicit decoder choice still stands


def test_bad_options_get_one_clear_error():
    with pytest.raises(ConfigError, match="has no option alpah"):
        MultiHeadAttention(D, H, spec=coda(alpah=4))
    with pytest.raises(ConfigError, match="normalization"):
        coda(normalization="sinkhorn")
    with pytest.raises(ConfigError, match="only applies to cascade"):
        AttentionSpec.from_config({"scheme": "dnas", "normalization": "unas"})
    with pytest.raises(ConfigError, match="alpha"):
        MultiHeadAttention(D, H, spec=coda(alpha=0))


def test_each_model_has_its_own_cascade():
    """Two models (from one spec object) never see each other's logits, even when interleaved."""
    spec = coda(noise=False)
    a, b = encoder(spec, n=2).eval(), encoder(spec, n=2).eval()
    with torch.no_grad():
        for p in b.parameters():
            p.add_(0.1 * torch.randn_like(p))
    x = torch.randn(2, 5, D)
    alone = run(a, x)
    h = a[0](x)
    run(b, torch.randn(2, 5, D))  # a whole forward of another model in between
    torch.testing.assert_close(a[1](h), alone)


def test_copies_and_checkpoints_keep_the_cascade():
    layers = encoder(coda(), n=3).eval()
    x = torch.randn(2, 5, D)
    ref = run(layers, x)
    clone = copy.deepcopy(layers)
    assert clone[1].self_attn.cascade.source.module is clone[0].self_attn  # links follow the copy
    torch.testing.assert_close(run(clone, x), ref)
    fresh = encoder(coda(), n=3)
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    fresh.load_state_dict(layers.state_dict())  # what load_from_checkpoint does
    torch.testing.assert_close(run(fresh.eval(), x), ref)


def test_layers_of_a_stack_must_run_in_order():
    layers = encoder(coda(), n=2).eval()
    with pytest.raises(ConfigError, match="must run in order"):
        layers[1](torch.randn(1, 4, D))


def test_link_stack_links_modules_by_hand():
    mods = [MultiHeadAttention(D, H, spec=coda(noise=False)) for _ in range(2)]
    link_stack(mods)
    assert mods[1].cascade.source.module is mods[0] and hasattr(mods[1], "cascade_mixer")
    # MultiHeadAttention modules put directly in a ModuleList (e.g. VQA's fusion) stay depth 1
    fusion = nn.ModuleList(MultiHeadAttention(D, H, spec=coda()) for _ in range(2))
    assert all(m.cascade.source is None for m in fusion)


def test_bf16_autocast_stays_finite():
    layers = encoder(coda(normalization="hnas"), n=2).train()
    x, mask = torch.randn(2, 6, D), padding(2, 6, seed=1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = run(layers, x, mask)
    out.float().sum().backward()
    assert torch.isfinite(out.float()).all()
    assert all(torch.isfinite(p.grad).all() for p in layers.parameters() if p.grad is not None)


def test_incremental_decoding_with_cached_keys_matches_the_full_pass():
    """attend_heads on one new query with cached keys/values (a decoder's step) cascades row by
    row exactly like the full causal pass."""
    torch.manual_seed(0)
    mods = [MultiHeadAttention(D, H, spec=coda(), is_decoder=True).eval() for _ in range(2)]
    link_stack(mods)
    x = torch.randn(2, 5, D)
    full = [m(x, causal=True) for m in mods]  # one full pass, layers in order
    keys = [m._split(m.k_proj(x)) for m in mods]
    values = [m._split(m.v_proj(x)) for m in mods]
    for t in range(5):
        for m, k, v, ref in zip(mods, keys, values, full):
            q = m._split(m.q_proj(x[:, t : t + 1]))
            out = m.attend_heads(q, k[:, :, : t + 1], v[:, :, : t + 1])
            step = m.out_proj(out.transpose(1, 2).reshape(2, 1, D))
            torch.testing.assert_close(step[:, 0], ref[:, t], atol=1e-5, rtol=1e-5)

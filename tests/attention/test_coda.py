"""CODA / coda_cs / RealFormer: logit transforms whose logits a stack passes explicitly from layer
to layer, against hand-written formulas, in every container and under checkpointing."""

import copy
import math

import pytest
import torch
from torch import nn

from attnlab.attention import (
    AttentionSpec,
    MultiHeadAttention,
    StackCarry,
    TransformerDecoderLayer,
    TransformerEncoderLayer,
    attention_modules,
    record_attention,
    run_stack,
    scheme_values,
)
from attnlab.attention.schemes.coda import HeadMixer
from attnlab.errors import ConfigError

D, H = 16, 4


def coda(**options):
    return AttentionSpec.from_config({"scheme": "coda", **options})


def encoder(spec, n=3, dropout=0.0, seed=0):
    torch.manual_seed(seed)
    return nn.ModuleList(TransformerEncoderLayer(D, H, 32, dropout, spec=spec, layer_index=i) for i in range(n))


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
    assert torch.equal(run_stack(layers, x, mask), run_stack(layers, x, mask))
    layers.train()
    a, b = run_stack(layers, x, mask), run_stack(layers, x, mask)
    assert (a - b).abs().max() > 1e-3
    # the noise is the only randomness: the same seed gives the same training forward
    torch.manual_seed(5)
    a = run_stack(layers, x, mask)
    torch.manual_seed(5)
    assert torch.equal(a, run_stack(layers, x, mask))


@pytest.mark.parametrize("scheme", ["coda", "realformer"])
def test_first_layer_without_noise_is_unas(scheme):
    spec = AttentionSpec.from_config({"scheme": scheme, "noise": False} if scheme == "coda" else scheme)
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
    layers = encoder(coda(noise=False, prev_residual=prev_residual), n=2).eval()
    first, second = layers[0].self_attn, layers[1].self_attn
    assert isinstance(second.transform.mixer, HeadMixer) and not hasattr(first.transform, "mixer")
    x = torch.randn(2, 5, D)
    with record_attention(layers) as rec:
        run_stack(layers, x)
    h = layers[0](x)  # the second layer's input (the first layer may run alone)
    c1, c2 = scores(first, x), scores(second, h)
    mixed = second.transform.mixer.net((c1 + c2).movedim(1, -1)).movedim(-1, 1)
    z2 = c2 + mixed + (c1 if prev_residual else 0)
    torch.testing.assert_close(rec.records["1.self_attn"].weights, torch.softmax(z2, -1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rec.records["0.self_attn"].weights, torch.softmax(c1, -1), atol=1e-5, rtol=1e-5)


def test_realformer_adds_the_logits_of_all_previous_layers():
    layers = encoder(AttentionSpec.from_config("realformer"), n=3).eval()
    x = torch.randn(2, 5, D)
    mods = [layer.self_attn for layer in layers]
    with record_attention(layers) as rec:
        run_stack(layers, x)
    h1 = layers[0](x)
    h2, z = layers[1](h1, prev_logits={"self_attn": scores(mods[0], x)}, return_logits=True)
    c = [scores(mods[0], x), scores(mods[1], h1), scores(mods[2], h2)]
    assert not list(layers.named_parameters(prefix="", recurse=True)) or not any(
        "transform" in n for n, _ in layers.named_parameters())  # deterministic, no parameters
    torch.testing.assert_close(z["self_attn"], c[0] + c[1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rec.records["2.self_attn"].weights, torch.softmax(c[0] + c[1] + c[2], -1),
                               atol=1e-5, rtol=1e-5)


def test_coda_cs_does_not_cascade():
    layers = encoder(AttentionSpec.from_config({"scheme": "coda", "cascade": False}), n=2)
    assert not any(m.transform.receives_logits or m.transform.passes_logits for _, m in attention_modules(layers))
    assert not any("mixer" in n for n, _ in layers.named_parameters())
    x = torch.randn(2, 5, D)
    _, logits = layers[0](x, return_logits=True)
    assert logits is None


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("spec", [coda(), coda(normalization="dnas"), coda(normalization="hnas"),
                                  coda(normalization="entmax", normalization_options={"alpha": 2}),
                                  AttentionSpec.from_config("realformer")])
def test_padding_gets_no_weight_and_nothing_is_nan(spec, training):
    layers = encoder(spec, n=3, dropout=0.0).train(training)
    x = torch.randn(4, 9, D, requires_grad=True)
    mask = padding(4, 9, seed=7)
    mask[3] = True  # one example is all padding
    with record_attention(layers) as rec:
        out = run_stack(layers, x, mask)
    out.square().sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in layers.parameters() if p.grad is not None)
    assert len(rec.records) == 3
    for r in rec.records.values():
        w = r.weights
        assert torch.isfinite(w).all()
        assert w.masked_select(mask[:, None, None, :].expand_as(w)).abs().max() == 0  # padded keys
        assert w.masked_select(mask[:, None, :, None].expand_as(w)).abs().max() == 0  # padded queries
        rows = w.sum(-1)[~mask[:, None, :].expand(-1, H, -1)]
        torch.testing.assert_close(rows, torch.ones_like(rows), atol=1e-5, rtol=0)
        if spec.normalization == "dnas":  # the DNAS lemma holds on the cascaded logits too
            s_valid = (~mask).sum(-1)[:3, None, None].float()
            cols = r.column_sums[:3].masked_fill(mask[:3, None, :], float("inf"))
            assert (cols * s_valid >= 1 - 1e-4).all()


def test_same_outputs_in_modulelist_sequential_and_under_checkpointing():
    """The logits travel as arguments: the container and recomputation do not matter."""
    layers = encoder(coda(), n=3).train()
    x, mask = torch.randn(2, 6, D), padding(2, 6, seed=4)
    as_sequential = nn.Sequential(*layers)
    torch.manual_seed(11)
    ref = run_stack(layers, x, mask)
    torch.manual_seed(11)
    seq = as_sequential(StackCarry(x, mask)).x
    torch.manual_seed(11)
    xc = x.clone().requires_grad_()
    ckpt = run_stack(layers, xc, mask, checkpoint=True)
    assert torch.equal(ref, seq) and torch.equal(ref, ckpt)
    # gradients through the recomputed cascade equal the plain ones
    ckpt.square().sum().backward()
    grad_ckpt = [p.grad.clone() for p in layers.parameters()]
    layers.zero_grad()
    torch.manual_seed(11)
    xr = x.clone().requires_grad_()
    run_stack(layers, xr, mask).square().sum().backward()
    torch.testing.assert_close(xc.grad, xr.grad)
    for a, p in zip(grad_ckpt, layers.parameters()):
        torch.testing.assert_close(a, p.grad)
    # and the cascade really is used: without the previous logits the second layer differs
    layers.eval()
    h, z = layers[0](x, mask, return_logits=True)
    assert (layers[1](h, mask, prev_logits=z) - layers[1](h, mask, prev_logits={"self_attn": 0 * z["self_attn"]})).abs().max() > 1e-4


def test_no_global_registration_hook_remains():
    import torch.nn.modules.module as module_lib

    hooks = getattr(module_lib, "_global_module_registration_hooks", {})
    assert not any("attnlab" in getattr(h, "__module__", "") for h in hooks.values())


def test_decoder_stacks_are_causal_and_match_step_by_step_decoding():
    torch.manual_seed(0)
    spec = coda()
    layers = nn.ModuleList(TransformerDecoderLayer(D, H, 32, 0.0, spec=spec, layer_index=i) for i in range(3)).eval()
    self_mods = [layer.self_attn for layer in layers]
    cross_mods = [layer.cross_attn for layer in layers]
    assert [m.role for m in cross_mods] == ["cross"] * 3 and self_mods[0].role == "decoder"
    assert cross_mods[1].transform.receives_logits and not cross_mods[0].transform.receives_logits
    memory, mem_mask = torch.randn(2, 6, D), padding(2, 6, seed=2)
    y = torch.randn(2, 5, D)

    def decode(prefix):
        return run_stack(layers, prefix, memory, memory_key_padding_mask=mem_mask)

    full = decode(y)
    for t in range(1, 6):  # re-running on a prefix, as beam search does, gives the same states
        torch.testing.assert_close(decode(y[:, :t]), full[:, :t], atol=1e-5, rtol=1e-5)
    # both stacks pass their logits on
    _, logits = layers[0](y, memory, memory_key_padding_mask=mem_mask, return_logits=True)
    assert set(logits) == {"self_attn", "cross_attn"}


def test_query_normalization_is_refused_in_decoders_only():
    with pytest.raises(ConfigError, match="decoder"):
        MultiHeadAttention(D, H, spec=coda(normalization="dnas"), is_decoder=True)
    with pytest.raises(ConfigError, match="decoder"):
        TransformerDecoderLayer(D, H, 32, spec=coda(normalization="hnas"))
    m = MultiHeadAttention(D, H, spec=coda(normalization="hnas"))
    assert scheme_values(m)["hnas_u"][""].shape == (H,)
    # a task's decoder gets the cascade scheme with UNAS; other schemes keep the task's decoder
    dec = coda(normalization="dnas").for_decoder("unas")
    assert dec.scheme == "coda" and dec.normalization == "unas" and dec.transform_options.alpha == 4
    assert AttentionSpec.from_config("hnas").for_decoder("unas").scheme == "unas"
    assert coda(decoder=False).for_decoder("unas").scheme == "unas"
    assert coda().for_decoder("dnas").scheme == "dnas"  # an explicit decoder choice still stands
    assert AttentionSpec.from_config("entmax").for_decoder("unas").scheme == "entmax"  # over keys


def test_bad_options_get_one_clear_error():
    with pytest.raises(ConfigError, match="has no option alpah"):
        MultiHeadAttention(D, H, spec=coda(alpah=4))
    with pytest.raises(ConfigError, match="normalization"):
        coda(normalization="nope")
    with pytest.raises(ConfigError, match="only applies to logit transforms"):
        AttentionSpec.from_config({"scheme": "dnas", "normalization": "unas"})
    with pytest.raises(ConfigError, match="alpha"):
        MultiHeadAttention(D, H, spec=coda(alpha=0))
    with pytest.raises(ConfigError, match="must be bool"):
        coda(noise="yes")


def test_layers_of_a_stack_need_the_logits_of_the_layer_before():
    layers = encoder(coda(), n=2).eval()
    with pytest.raises(ConfigError, match="run_stack"):
        layers[1](torch.randn(1, 4, D))  # a plain loop would silently lose the cascade
    first, z = layers[0](torch.randn(1, 4, D), return_logits=True)
    with pytest.raises(ConfigError, match="layer_index"):
        layers[0](first, prev_logits=z)  # the first layer of a stack takes no logits
    with pytest.raises(ConfigError, match="shape"):
        layers[1](torch.randn(1, 5, D), prev_logits=z)


def test_each_forward_cascades_from_scratch():
    """Nothing is stored on modules: two models (from one spec) interleaved never mix."""
    spec = coda(noise=False)
    a, b = encoder(spec, n=2).eval(), encoder(spec, n=2, seed=1).eval()
    x = torch.randn(2, 5, D)
    alone = run_stack(a, x)
    h, z = a[0](x, return_logits=True)
    run_stack(b, torch.randn(2, 5, D))  # a whole forward of another model in between
    torch.testing.assert_close(a[1](h, prev_logits=z), alone)


def test_copies_and_checkpoints_keep_the_cascade():
    layers = encoder(coda(), n=3).eval()
    x = torch.randn(2, 5, D)
    ref = run_stack(layers, x)
    torch.testing.assert_close(run_stack(copy.deepcopy(layers), x), ref)
    fresh = encoder(coda(), n=3)
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    fresh.load_state_dict(layers.state_dict())  # what load_from_checkpoint does
    torch.testing.assert_close(run_stack(fresh.eval(), x), ref)


def test_checkpoints_from_before_the_registry_still_load():
    layers = encoder(coda(normalization="hnas"), n=2)
    state = layers.state_dict()
    old = {k.replace("normalizer.hybrid_logit", "hybrid_logit").replace("transform.mixer.", "cascade_mixer."): v
           for k, v in state.items()}
    assert "1.self_attn.cascade_mixer.net.0.weight" in old and "0.self_attn.hybrid_logit" in old
    fresh = encoder(coda(normalization="hnas"), n=2, seed=3)
    fresh.load_state_dict(old)
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, state[k]), k


def test_bf16_autocast_stays_finite():
    layers = encoder(coda(normalization="hnas"), n=2).train()
    x, mask = torch.randn(2, 6, D), padding(2, 6, seed=1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = run_stack(layers, x, mask)
    out.float().sum().backward()
    assert torch.isfinite(out.float()).all()
    assert all(torch.isfinite(p.grad).all() for p in layers.parameters() if p.grad is not None)


def test_incremental_decoding_with_cached_keys_matches_the_full_pass():
    """attend_heads on one new query with cached keys/values (a decoder's step) cascades row by
    row exactly like the full causal pass."""
    torch.manual_seed(0)
    mods = [MultiHeadAttention(D, H, spec=coda(), is_decoder=True, layer_index=i).eval() for i in range(2)]
    x = torch.randn(2, 5, D)
    out0, z0 = mods[0](x, causal=True, return_logits=True)
    full = [out0, mods[1](x, causal=True, prev_logits=z0)]
    keys = [m._split(m.k_proj(x)) for m in mods]
    values = [m._split(m.v_proj(x)) for m in mods]
    for t in range(5):
        prev = None
        for m, k, v, ref in zip(mods, keys, values, full):
            q = m._split(m.q_proj(x[:, t : t + 1]))
            out, prev = m.attend_heads(q, k[:, :, : t + 1], v[:, :, : t + 1], prev_logits=prev)
            step = m.out_proj(out.transpose(1, 2).reshape(2, 1, D))
            torch.testing.assert_close(step[:, 0], ref[:, t], atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- the head MLP itself
def mlp_by_hand(net: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """sigma(x) in float64 from the Linears' parameters alone: LeakyReLU(0.2) between them, none
    after the last (the paper's MLP), over the last axis."""
    linears = [m for m in net if isinstance(m, nn.Linear)]
    for i, lin in enumerate(linears):
        x = x @ lin.weight.double().T + lin.bias.double()
        if i < len(linears) - 1:
            x = torch.where(x > 0, x, 0.2 * x)
    return x


@pytest.mark.parametrize(("alpha", "hidden", "widths"), [
    (None, None, [(4, 16), (16, 16), (16, 4)]),  # the defaults: alpha 4, two hidden layers
    (1, 1, [(4, 4), (4, 4)]),  # the smallest options allowed
    (2, 3, [(4, 8), (8, 8), (8, 8), (8, 4)]),
])
def test_head_mixer_is_the_papers_mlp(alpha, hidden, widths):
    torch.manual_seed(0)
    kw = {k: v for k, v in (("alpha", alpha), ("hidden_layers", hidden)) if v is not None}
    mixer = HeadMixer(H, **kw)
    assert [(m.in_features, m.out_features) for m in mixer.net if isinstance(m, nn.Linear)] == widths
    with torch.no_grad():
        for p in mixer.parameters():  # biases away from 0, so that a missing one would show
            p.add_(0.3 * torch.randn_like(p))
    z = 3 * torch.randn(2, H, 5, 6, dtype=torch.float64)  # large enough that many units are negative
    ref = mlp_by_hand(mixer.net, z.movedim(1, -1)).movedim(-1, 1)
    out = mixer(z)  # float64 logits through the float32 MLP, returned as float64
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    half = mixer(z.to(torch.bfloat16))
    assert half.dtype == torch.bfloat16 and torch.isfinite(half).all()


def test_head_mixer_starts_as_the_published_initialization():
    """xavier_uniform with gain 1/sqrt(2): U(-b, b), b = sqrt(6 / (fan_in + fan_out)) / sqrt(2);
    biases 0."""
    torch.manual_seed(0)
    mixer = HeadMixer(H)
    for lin in (m for m in mixer.net if isinstance(m, nn.Linear)):
        bound = math.sqrt(6 / (lin.in_features + lin.out_features)) / math.sqrt(2)
        w = lin.weight.detach()
        assert w.abs().max() <= bound and w.abs().max() > 0.9 * bound, (w.abs().max(), bound)
        assert torch.equal(lin.bias, torch.zeros_like(lin.bias))


def test_options_build_the_mixer_they_name_and_reject_below_one():
    m = MultiHeadAttention(D, H, spec=coda(alpha=1, mlp_layers=1), layer_index=1)
    assert [(l.in_features, l.out_features) for l in m.transform.mixer.net if isinstance(l, nn.Linear)] == [(H, H), (H, H)]
    m = MultiHeadAttention(D, H, spec=coda(alpha=2, mlp_layers=3), layer_index=1)
    assert sum(isinstance(l, nn.Linear) for l in m.transform.mixer.net) == 4
    for key in ("alpha", "mlp_layers"):
        with pytest.raises(ConfigError, match=rf"^model\.{key}=0 must be an integer >= 1$"):
            coda(**{key: 0}).build_transform(H, receives_logits=True)


@pytest.mark.parametrize("name", ["coda", "realformer"])
def test_a_transform_built_with_defaults_is_the_first_layer_of_one_head(name):
    from attnlab.attention.schemes import TRANSFORMS

    cls = TRANSFORMS[name]
    first = cls()
    assert first.options == cls.Options() and first.num_heads == 1 and not first.receives_logits
    assert not hasattr(first, "mixer")
    scores = torch.randn(1, 1, 3, 3)
    assert torch.equal(first.eval()(scores, None), scores)  # no previous layer: the scores
    later = cls(num_heads=H, receives_logits=True)
    assert later.num_heads == H and later.receives_logits


# ----------------------------------------------------------------------------- the cascade step itself
def _heads_problem(seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, H, 5, 4, generator=g) for _ in range(3))
    mask = torch.zeros(2, 5, dtype=torch.bool)
    mask[1, -2:] = True
    return q, k, v, mask


def test_the_cascade_step_checks_masks_and_causality_and_drops_weights():
    """A transform's attend_heads validates the call as the normalization's own attend would
    (masks; a query normalization refused in causal attention, a causal-only one run there) and
    drops weights with the attention dropout."""
    from attnlab.attention.schemes.base import Heads
    from attnlab.attention.schemes.coda import Coda, CodaOptions
    from attnlab.attention.schemes.normalizer import apply_weights

    first = Coda(CodaOptions(noise=False), H)
    unas = AttentionSpec("unas").build_normalizer()
    q, k, v, mask = _heads_problem()
    for key in ("key_padding_mask", "query_padding_mask"):
        with pytest.raises(ConfigError, match=rf"^{key} must be a bool tensor \(True = padding\)"):
            first.attend_heads(unas, Heads(q, k, v, **{key: mask.float()}))
    with pytest.raises(ConfigError, match="leaks the future"):
        first.attend_heads(AttentionSpec("dnas").build_normalizer(), Heads(q, k, v, causal=True))
    stick = first.attend_heads(AttentionSpec("stickbreaking").build_normalizer(), Heads(q, k, v, causal=True))
    assert torch.isfinite(stick.out).all()
    torch.manual_seed(3)
    dropped = first.attend_heads(unas, Heads(q, k, v, dropout_p=0.5))
    torch.manual_seed(3)  # the same seed drops the same weights
    weights = torch.softmax(q @ k.transpose(-2, -1) / 2.0, -1)
    torch.testing.assert_close(dropped.out, apply_weights(weights, v, 0.5), atol=1e-6, rtol=0)
    assert not torch.allclose(dropped.out, weights @ v, atol=1e-3)


def test_a_transform_gets_and_passes_on_logits_that_are_zero_where_masked():
    """`forward` is given this layer's scores and the previous layer's logits with 0 at masked
    pairs, and the logits handed on are 0 there too (finite: the next layer masks them again)."""
    from attnlab.attention import LogitTransform
    from attnlab.attention.schemes.base import Heads

    seen = []

    class Adding(LogitTransform):
        name = "test_adding"

        def forward(self, scores, previous):
            seen.append((scores, previous))
            return scores + previous + 1.0  # 1 everywhere the masks do not zero it

    layer = Adding(None, H, receives_logits=True)
    unas = AttentionSpec("unas").build_normalizer()
    q, k, v, mask = _heads_problem(seed=1)
    previous = torch.randn(2, H, 5, 5)
    attended = layer.attend_heads(unas, Heads(q, k, v, key_padding_mask=mask, prev_logits=previous))
    ((given_scores, given),) = seen
    masked = torch.zeros(2, 1, 5, 5, dtype=torch.bool)
    masked[1, ..., 3:] = True  # example 1's last two keys are padding
    assert (given_scores.masked_select(masked) == 0).all() and (given.masked_select(masked) == 0).all()
    assert torch.equal(given.masked_select(~masked), previous.masked_select(~masked))
    assert (attended.logits.masked_select(masked) == 0).all()
    assert (attended.logits.masked_select(~masked) != 0).all()
    assert (attended.weights.masked_select(masked) == 0).all()


# ----------------------------------------------------------------------------- RealFormer without (S, S) maps
@pytest.mark.parametrize("positions, normalization", [("none", "unas"), ("alibi", "unas"), ("rope", "sigmoid")])
def test_realformer_stack_hands_on_stacked_queries_and_keys_equal_to_the_materialized_cascade(positions, normalization):
    """run_stack carries StackedScores (the layers' q and k concatenated: no (S, S) map) and gets,
    in float64 with padding and causality, the outputs and gradients of the materialized cascade
    (each layer handed the summed logits as a tensor)."""
    from attnlab.attention.schemes.realformer import StackedScores

    spec = AttentionSpec.from_config({"scheme": "realformer", "normalization": normalization})
    torch.manual_seed(0)
    layers = nn.ModuleList(TransformerEncoderLayer(D, H, 32, 0.0, spec=spec, layer_index=i, positions=positions,
                                                   causal=True)
                           for i in range(3)).double().eval()
    x = torch.randn(2, 7, D, dtype=torch.float64, requires_grad=True)
    mask = padding(2, 7, seed=3)
    handed = []
    h, logits = x, None
    for layer in layers:
        h, logits = layer(h, mask, prev_logits=logits, return_logits=True)
        handed.append(logits["self_attn"])
    assert all(isinstance(z, StackedScores) for z in handed)
    assert handed[2].q.shape == (2, H, 7, 3 * handed[0].width)  # O(S l D), not (S, S)
    fast = h
    grad_fast = torch.autograd.grad(fast.square().sum(), x)[0]
    # the materialized cascade: each later layer handed the logits as a tensor
    h, z = x, None
    for i, layer in enumerate(layers):
        if i == 0:
            h, out = layer(h, mask, return_logits=True)
            s = out["self_attn"]
            z = (s.scaled_q() @ s.k.transpose(-2, -1) / math.sqrt(s.q.shape[-1])).masked_fill(
                torch.ones(7, 7, dtype=torch.bool).tril().logical_not(), 0.0)
        else:
            h, out = layer(h, mask, prev_logits={"self_attn": z}, return_logits=True)
            z = out["self_attn"]
            assert isinstance(z, torch.Tensor) and z.shape == (2, H, 7, 7)
    torch.testing.assert_close(fast, h, atol=1e-10, rtol=1e-10)
    grad_slow = torch.autograd.grad(h.square().sum(), x)[0]
    torch.testing.assert_close(grad_fast, grad_slow, atol=1e-9, rtol=1e-9)


def test_realformer_records_its_summed_maps_when_asked():
    torch.manual_seed(0)
    layers = nn.ModuleList(TransformerEncoderLayer(D, H, 32, 0.0, spec="realformer", layer_index=i, causal=True)
                           for i in range(3)).eval()
    x = torch.randn(2, 5, D)
    mask = padding(2, 5, seed=1)
    with record_attention(layers) as rec:
        run_stack(layers, x, mask)
    h1 = layers[0](x, mask)
    h2 = layers[1](h1, mask, prev_logits={"self_attn": scores(layers[0].self_attn, x)})
    mods = [layer.self_attn for layer in layers]
    z = scores(mods[0], x) + scores(mods[1], h1) + scores(mods[2], h2)
    valid = torch.ones(5, 5, dtype=torch.bool).tril() & ~mask[:, None, None, :]
    expected = torch.softmax(z.masked_fill(~valid, float("-inf")), -1)
    rows = ~mask  # padded queries' rows are the scheme's business
    torch.testing.assert_close(rec.records["2.self_attn"].weights.transpose(1, 2)[rows],
                               expected.transpose(1, 2)[rows], atol=1e-5, rtol=1e-5)

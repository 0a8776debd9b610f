"""The scheme registry: every registered scheme, its options, its fast paths, its parameters,
and a scheme registered at run time."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from helpers.paths import ROOT
from torch import Tensor

from attnlab.attention import (
    AttentionSpec,
    MultiHeadAttention,
    Normalizer,
    TransformerDecoderLayer,
    TransformerEncoderLayer,
    attend,
    attention_weights,
    reference_attend,
    register,
    scheme_parameters,
)
from attnlab.attention.paths import FastPath
from attnlab.attention.reference import safe_log_normalize
from attnlab.attention.schemes import NORMALIZERS, TRANSFORMS, unregister
from attnlab.attention.schemes.dnas import DNAS
from attnlab.errors import ConfigError

E, H = 16, 4


def inputs(seed=0, S=6):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, H, S, 8, generator=g) for _ in range(3))
    mask = torch.zeros(2, S, dtype=torch.bool)
    mask[1, -2:] = True
    return q, k, v, mask


# ----------------------------------------------------------------------------- registered schemes
@pytest.mark.parametrize("name", sorted(NORMALIZERS))
def test_decoder_guard_follows_the_schemes_own_property(name):
    """over_queries alone decides: refused in decoders and causal stacks, allowed elsewhere."""
    cls = NORMALIZERS[name]
    MultiHeadAttention(E, H, spec=name)  # encoders take every scheme
    if cls.over_queries:
        with pytest.raises(ConfigError, match="decoder"):
            MultiHeadAttention(E, H, spec=name, is_decoder=True)
        with pytest.raises(ConfigError, match="decoder"):
            TransformerEncoderLayer(E, H, 32, spec=name, causal=True)
        q, k, v, _ = inputs()
        with pytest.raises(ConfigError, match="leaks the future"):
            attend(q, k, v, name, causal=True, u=0.5)
    else:
        layer = TransformerEncoderLayer(E, H, 32, 0.0, spec=name, causal=True).eval()
        x = torch.randn(2, 5, E)
        out = layer(x)
        x2 = x.clone()
        x2[:, 3:] = torch.randn(2, 2, E)  # changing the future leaves the past alone
        torch.testing.assert_close(layer(x2)[:, :3], out[:, :3], atol=1e-6, rtol=0)
        TransformerDecoderLayer(E, H, 32, spec=name)


@pytest.mark.parametrize("name", sorted(NORMALIZERS) + sorted(TRANSFORMS))
def test_every_scheme_has_a_model_config(name):

    root = ROOT
    assert (root / "conf" / "model" / f"{name}.yaml").is_file()
    spec = AttentionSpec.from_config(name)
    assert spec.scheme == name and AttentionSpec.from_config(spec.to_dict()) == spec


def test_options_are_validated_by_their_scheme():
    with pytest.raises(ConfigError, match=r"model=sinkhorn has no option n_itr; its options are .*n_iter"):
        AttentionSpec("sinkhorn", n_itr=3)
    with pytest.raises(ConfigError, match="n_iter=0 must be >= 1"):
        AttentionSpec("sinkhorn", n_iter=0)
    with pytest.raises(ConfigError, match=r"hybrid_init=2 is outside \[0, 1\]"):
        AttentionSpec("hnas", hybrid_init=2)
    with pytest.raises(ConfigError, match=r"hybrid_init='a': .* must be float, e\.g\. model\.hybrid_init=0\.5$"):
        AttentionSpec("hnas", hybrid_init="a")
    # param_lr, the option of every scheme with parameters, is checked in one place for all
    with pytest.raises(ConfigError, match=r"^model\.param_lr=-0\.1 must be > 0 \(or null"):
        AttentionSpec("hnas", param_lr=-0.1)
    with pytest.raises(ConfigError, match="alpha=1 must be > 1"):
        AttentionSpec("entmax", alpha=1)
    # an option of another registered scheme is ignored (tasks set model.hybrid_init for HNAS
    # whatever the model is); the spec keeps only what its scheme takes
    spec = AttentionSpec("unas", hybrid_init=0.1, n_iter=3)
    assert spec.to_dict() == {"scheme": "unas", "decoder": True}
    # ints are floats where a float is wanted
    assert AttentionSpec("hnas", hybrid_init=1).normalizer_options.hybrid_init == 1.0


def test_transform_options_and_normalization_options_do_not_clash():
    spec = AttentionSpec("coda", normalization="entmax", alpha=8, normalization_options={"alpha": 2})
    assert spec.transform_options.alpha == 8 and spec.normalizer_options.alpha == 2.0
    m = MultiHeadAttention(E, H, spec=spec, layer_index=1)
    assert m.transform.mixer.net[0].out_features == 8 * H
    assert type(m.normalizer).__name__ == "Entmax"


def test_scheme_parameters_are_found_by_type_and_train_at_their_schemes_rate():
    layers = torch.nn.ModuleList(
        TransformerEncoderLayer(E, H, 32, spec={"scheme": "coda", "normalization": "hnas",
                                                "param_lr": 0.05}, layer_index=i)
        for i in range(2))
    normalizer_params = dict(scheme_parameters(layers))
    assert sorted(normalizer_params) == ["0.self_attn.normalizer.hybrid_logit",
                                         "1.self_attn.normalizer.hybrid_logit"]
    from attnlab.attention import LogitTransform

    mixers = dict(scheme_parameters(layers, LogitTransform))
    assert mixers and all(".transform.mixer." in n and n.startswith("1.") for n in mixers)
    from attnlab.task_module import parameter_groups

    groups = parameter_groups(layers, weight_decay=0.01, lr=1e-3)
    assert groups[-1]["lr"] == 0.05 and groups[-1]["weight_decay"] == 0.0
    assert {id(p) for p in groups[-1]["params"]} == {id(p) for p in normalizer_params.values()}
    assert sum(len(g["params"]) for g in groups) == len(list(layers.parameters()))
    # without a param_lr of its own, a scheme's parameters take `lr` (still undecayed)
    plain = MultiHeadAttention(E, H, spec="hnas")
    *_, own = parameter_groups(plain, weight_decay=0.01, lr=1e-3)
    assert own == {"params": [plain.normalizer.hybrid_logit], "weight_decay": 0.0, "lr": 1e-3}
    # two schemes at two rates: a group each
    mixed = torch.nn.ModuleList([MultiHeadAttention(E, H, spec={"scheme": "hnas", "param_lr": 0.1}),
                                 MultiHeadAttention(E, H, spec={"scheme": "hnas", "param_lr": 0.2})])
    assert [g.get("lr") for g in parameter_groups(mixed, 0.0, lr=1e-3)][-2:] == [0.1, 0.2]


def test_schemes_report_their_parameters_per_layer_and_head():
    from attnlab.attention import scheme_values

    model = torch.nn.ModuleList([MultiHeadAttention(E, H, spec={"scheme": "hnas", "hybrid_init": 0.2}),
                                 MultiHeadAttention(E, H, spec="dnas"),
                                 MultiHeadAttention(E, H, spec={"scheme": "hnas", "hybrid_init": 0.7})])
    values = scheme_values(model)
    assert list(values) == ["hnas_u"] and list(values["hnas_u"]) == ["0", "2"]
    torch.testing.assert_close(values["hnas_u"]["0"], torch.full((H,), 0.2))
    torch.testing.assert_close(values["hnas_u"]["2"], torch.full((H,), 0.7))
    assert scheme_values(MultiHeadAttention(E, H, spec="unas")) == {}


# ----------------------------------------------------------------------------- run-time schemes
class Squared(Normalizer):
    """A throwaway scheme: softmax over keys of twice the logits."""

    name = "test_squared"

    def weights(self, logits: Tensor) -> Tensor:
        return safe_log_normalize(2 * logits, dim=-1).exp()


class NotQuiteDNAS(DNAS):
    """Inherits DNAS's fast paths, but changes the weights: it must not run DNAS's kernel."""

    name = "test_not_quite_dnas"

    def weights(self, logits: Tensor) -> Tensor:
        return safe_log_normalize(logits.clamp(max=0.1), dim=-1).exp()


@pytest.fixture
def registered():
    for cls in (Squared, NotQuiteDNAS):
        register(cls)
    yield
    for cls in (Squared, NotQuiteDNAS):
        unregister(cls.name)


@pytest.mark.parametrize("scheme", [Squared, NotQuiteDNAS])
def test_a_scheme_registered_at_run_time_runs_itself_never_another_kernel(registered, scheme):
    q, k, v, mask = inputs(seed=2)
    with torch.no_grad():
        out = attend(q, k, v, scheme.name, key_padding_mask=mask, query_padding_mask=mask)
        logits = torch.einsum("bhid,bhjd->bhij", q, k) / 8**0.5
        logits = logits.masked_fill(mask[:, None, None, :] | mask[:, None, :, None], float("-inf"))
        expected = scheme().weights(logits) @ v
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert NotQuiteDNAS.fast_paths == () and DNAS.fast_paths  # not inherited with new weights
    # and it is a model= choice everywhere: modules, analyses, decoders where it normalizes over keys
    layer = (TransformerEncoderLayer if scheme.over_queries else TransformerDecoderLayer)(E, H, 32, spec=scheme.name)
    assert type(layer.self_attn.normalizer) is scheme
    w = attention_weights(q, k, scheme.name)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, H, 6))


def test_an_unregistered_or_transform_name_is_not_silently_run():
    q, k, v, _ = inputs()
    with pytest.raises(ConfigError, match="unknown attention scheme 'test_squared'"):
        attend(q, k, v, "test_squared")
    with pytest.raises(ConfigError, match="transforms logits across the layers"):
        attend(q, k, v, "coda")
    with pytest.raises(ConfigError, match="unknown argument"):
        attend(q, k, v, "unas", temperature=2.0)


# ----------------------------------------------------------------------------- entmax
def test_sparsemax_equals_the_euclidean_projection_by_hand():
    # one row of logits (1, 1, 1, 4) * sqrt(d): sparsemax = max(z - tau, 0) with sum 1
    z = torch.tensor([1.5, 1.0, 0.1, -2.0])
    # support {0, 1}: tau = (1.5 + 1.0 - 1) / 2 = 0.75 -> [0.75, 0.25, 0, 0]
    w = AttentionSpec("entmax", alpha=2).build_normalizer().weights(z.view(1, 1, 1, 4))
    torch.testing.assert_close(w.view(4), torch.tensor([0.75, 0.25, 0.0, 0.0]))


@pytest.mark.parametrize("alpha", [1.5, 2.0, 1.3])
def test_entmax_is_sparse_normalized_and_masks_both_sides(alpha):
    q, k, v, mask = inputs(seed=4)
    q = q * 3
    mask[0] = True  # an example with everything padded
    w = attention_weights(q, k, "entmax", key_padding_mask=mask, query_padding_mask=mask, alpha=alpha)
    assert torch.isfinite(w).all() and (w >= 0).all()
    assert (w[0] == 0).all() and (w[1][..., -2:] == 0).all() and (w[1][..., -2:, :] == 0).all()
    rows = w[1, :, :-2].sum(-1)
    torch.testing.assert_close(rows, torch.ones_like(rows), atol=1e-5, rtol=0)
    assert (w[1, :, :-2, :-2] == 0).any()  # sparse: some valid keys get exactly zero weight
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    attend(qg, kg, vg, "entmax", key_padding_mask=mask, query_padding_mask=mask, alpha=alpha).sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (qg, kg, vg))


@dataclass(frozen=True)
class TemperedOptions:
    param_lr: float | None = None


class Tempered(Normalizer):
    """A throwaway scheme with a parameter: softmax over keys of t_h * logits, t_h per head."""

    name = "test_tempered"
    Options = TemperedOptions
    input_names = ("t",)

    def __init__(self, options=None, num_heads=None):
        super().__init__(options, num_heads)
        if num_heads is not None:
            self.temperature = torch.nn.Parameter(torch.linspace(0.5, 1.5, num_heads))

    def state_inputs(self):
        return {"t": self.temperature.view(1, -1, 1, 1)} if hasattr(self, "temperature") else {}

    def reported(self):
        return {"t": self.temperature.detach().clone()}

    def weights(self, logits: Tensor, t: Tensor) -> Tensor:
        return safe_log_normalize(t * logits, dim=-1).exp()


def test_a_new_scheme_with_a_parameter_needs_no_edit_outside_its_class(tmp_path):
    """Its parameter trains at its own param_lr without decay, is reported per layer and head
    (scheme_values, metrics.json's scheme_params) and plotted by SchemeParameters: nothing
    else names it."""
    import pytorch_lightning as pl

    from attnlab.attention import scheme_values
    from attnlab.callbacks import SchemeParameters
    from attnlab.run_record import scheme_params
    from attnlab.task_module import parameter_groups

    register(Tempered)
    try:
        model = torch.nn.ModuleList(MultiHeadAttention(E, H, spec={"scheme": "test_tempered",
                                                                    "param_lr": 0.3})
                                    for _ in range(2))
        *_, own = parameter_groups(model, weight_decay=0.1, lr=1e-3)
        assert own["lr"] == 0.3 and own["weight_decay"] == 0.0
        assert {id(p) for p in own["params"]} == {id(m.normalizer.temperature) for m in model}
        values = scheme_values(model)
        assert list(values) == ["test_tempered_t"] and list(values["test_tempered_t"]) == ["0", "1"]
        per_head = [0.5, 0.8333, 1.1667, 1.5]  # rounded for reading
        assert scheme_params(model) == {"test_tempered_t": {"0": per_head, "1": per_head}}
        # the callback logs and plots it as it does HNAS's u
        trainer = pl.Trainer(default_root_dir=tmp_path, logger=False, max_steps=0)
        callback = SchemeParameters()
        callback._record(trainer, model)
        assert list(callback.history) == ["test_tempered_t"]
        assert callback.write_png("test_tempered_t", tmp_path / "t.png").stat().st_size > 1000
    finally:
        unregister(Tempered.name)


# ----------------------------------------------------------------------------- HNAS's u
def test_hnas_options_name_the_fix_and_the_functional_form_takes_u_as_given():
    with pytest.raises(ConfigError, match=r"^model\.hybrid_per='row'; use 'head' \(one u per head\) or 'layer'$"):
        AttentionSpec("hnas", hybrid_per="row")
    functional = AttentionSpec("hnas").build_normalizer()  # no heads: owns no u
    assert functional.state_inputs() == {} and functional.reported() == {}
    assert not list(functional.parameters())
    q, k, v, mask = inputs(seed=3)
    with pytest.raises(ConfigError, match=r"^scheme='hnas' needs u \(broadcastable to \(B, H, 1, 1\), e\.g\. u=0\.5\)$"):
        attend(q, k, v, "hnas")
    # an integer u is a number like any other: u=1 is DNAS, u=0 is UNAS
    for u, pure in ((1, "dnas"), (0, "unas")):
        torch.testing.assert_close(attention_weights(q, k, "hnas", key_padding_mask=mask, u=u),
                                   attention_weights(q, k, pure, key_padding_mask=mask))
    # per layer: one logit, the same u reported for every head
    layer = MultiHeadAttention(E, H, spec={"scheme": "hnas", "hybrid_per": "layer", "hybrid_init": 0.3})
    assert layer.normalizer.hybrid_logit.shape == (1,)
    torch.testing.assert_close(layer.normalizer.reported()["u"], torch.full((H,), 0.3))


# ----------------------------------------------------------------------------- entmax, any alpha
def entmax_by_bisection(z: Tensor, alpha: float) -> Tensor:
    """alpha-entmax of each row in float64 from its definition (Peters et al. 2019):
    p_i = [(alpha - 1) z_i - tau]_+ ^ (1 / (alpha - 1)), tau such that sum p = 1."""
    z = (alpha - 1) * z.double()
    lo, hi = z.amax(-1, keepdim=True) - 1.0, z.amax(-1, keepdim=True)
    for _ in range(200):
        tau = (lo + hi) / 2
        total = (z - tau).clamp(min=0).pow(1 / (alpha - 1)).sum(-1, keepdim=True)
        lo, hi = torch.where(total >= 1, tau, lo), torch.where(total >= 1, hi, tau)
    return (z - (lo + hi) / 2).clamp(min=0).pow(1 / (alpha - 1))


# 1.5 and 2 have their own exact forms, every other alpha runs the bisection: alphas on both
# sides of them (1.3, 2.5, 3) show a form picked for the wrong alpha
@pytest.mark.parametrize("alpha", [1.5, 2.0, 1.3, 2.5, 3.0])
def test_entmax_equals_its_definition_for_every_alpha(alpha):
    q, k, _, mask = inputs(seed=5)
    q = 2 * q
    w = attention_weights(q, k, "entmax", key_padding_mask=mask, alpha=alpha)
    logits = q.double() @ k.double().transpose(-2, -1) / 8**0.5
    ref = entmax_by_bisection(logits.masked_fill(mask[:, None, None, :], float("-inf")), alpha)
    torch.testing.assert_close(w.double(), ref, atol=2e-5, rtol=0)


# ----------------------------------------------------------------------------- base and registry
def test_option_type_errors_name_the_key_the_types_and_an_example():
    with pytest.raises(ConfigError, match=r"^model\.param_lr='x': hnas's option param_lr must be float or "
                                          r"null, e\.g\. model\.param_lr=null$"):
        AttentionSpec("hnas", param_lr="x")
    with pytest.raises(ConfigError, match=r"^model\.noise='yes': coda's option noise must be bool, e\.g\. "
                                          r"model\.noise=true$"):
        AttentionSpec("coda", noise="yes")
    with pytest.raises(ConfigError, match=r"^model\.mlp_layers=1\.5: coda's option mlp_layers must be int, "
                                          r"e\.g\. model\.mlp_layers=2$"):
        AttentionSpec("coda", mlp_layers=1.5)


def test_causal_errors_list_exactly_the_schemes_that_fit():
    q, k, v, _ = inputs()
    causal_fit = [n for n in sorted(NORMALIZERS) if not NORMALIZERS[n].over_queries] + \
        [n for n in sorted(TRANSFORMS)] + ["diff"]
    with pytest.raises(ConfigError) as info:
        attend(q, k, v, "dnas", causal=True)
    assert str(info.value).endswith("Use a scheme that normalizes over keys where attention is causal: "
                                    + ", ".join(f"model={n}" for n in causal_fit) + ".")
    assert str(info.value).startswith("causal attention with scheme='dnas' is not allowed: dnas normalizes "
                                      "every key column over all queries")
    assert "model=stickbreaking" in str(info.value) and "model=hnas" not in str(info.value)
    noncausal_fit = [n for n in sorted(NORMALIZERS) if not NORMALIZERS[n].causal_only] + \
        [n for n in sorted(TRANSFORMS) if not TRANSFORMS[n].causal_only] + ["diff"]
    with pytest.raises(ConfigError) as info:
        attend(q, k, v, "stickbreaking")
    assert str(info.value) == (
        "scheme='stickbreaking' is defined for causal attention only (each query breaks its stick "
        "over the keys before it); this attention is not causal. Use stickbreaking in a causal "
        "language model (task=lm), or here one of " + ", ".join(f"model={n}" for n in noncausal_fit) + ".")


def test_a_causal_only_transform_names_itself_and_why():
    from attnlab.attention import LogitTransform

    selective = TRANSFORMS["selective"]()
    with pytest.raises(ConfigError, match=r"^scheme='selective' is defined for causal attention only \(a "
                                          r"token masks keys from the queries after it"):
        selective.check_causal(False)
    selective.check_causal(True)

    class CausalOnly(LogitTransform):  # declares no reason: the message points to its docs
        name = "test_causal_only"
        causal_only = True

    with pytest.raises(ConfigError, match=r"^scheme='test_causal_only' is defined for causal attention "
                                          r"only \(see its docs\)"):
        CausalOnly().check_causal(False)


def test_register_checks_names_and_kinds_and_unregister_forgets_every_kind():
    from attnlab.attention import HeadScheme, LogitTransform
    from attnlab.attention.schemes import HEAD_SCHEMES

    class Plain(Normalizer):
        pass

    for bad in ("", "Upper", "has-dash", "a b"):
        Plain.name = bad
        with pytest.raises(ValueError, match=rf"^Plain\.name must be a lower-case identifier, got {bad!r}$"):
            register(Plain)
    Plain.name = "_"  # underscores are allowed inside a name, but a name of none but them is not
    with pytest.raises(ValueError, match="lower-case identifier"):
        register(Plain)
    with pytest.raises(ValueError, match=r"^NoName\.name must be a lower-case identifier, got ''$"):
        register(type("NoName", (), {}))
    with pytest.raises(TypeError, match=r"^Other is neither a Normalizer, a LogitTransform nor a HeadScheme$"):
        register(type("Other", (), {"name": "test_other"}))
    Plain.name = "coda"  # a transform's name: taken across the kinds
    with pytest.raises(ValueError, match=r"^scheme name 'coda' is taken by Coda$"):
        register(Plain)
    assert NORMALIZERS.get("coda") is None and TRANSFORMS["coda"].__name__ == "Coda"

    tables = {Normalizer: NORMALIZERS, LogitTransform: TRANSFORMS, HeadScheme: HEAD_SCHEMES}
    for base, table in tables.items():
        cls = type(f"Own{base.__name__}", (base,), {"name": "test_own"})
        try:
            assert register(cls) is cls and register(cls) is cls  # re-registering replaces
            assert table["test_own"] is cls and all("test_own" not in t for t in tables.values() if t is not table)
        finally:
            unregister("test_own")
        assert "test_own" not in table


def test_a_subclass_keeps_its_parents_kernels_only_while_it_keeps_the_parents_weights():
    mine = FastPath("mine", lambda *a: True, lambda normalizer, call: call.v)

    class Renamed(DNAS):  # the same weights: DNAS's kernels compute it
        name = "test_renamed"

    class Listed(DNAS):  # new weights with kernels of its own
        name = "test_listed"
        fast_paths = (mine,)

        def weights(self, logits: Tensor) -> Tensor:
            return safe_log_normalize(logits, dim=-1).exp()

    class Bare(DNAS):  # new weights, no kernels: the reference only
        name = "test_bare"

        def weights(self, logits: Tensor) -> Tensor:
            return safe_log_normalize(logits, dim=-1).exp()

    assert Renamed.fast_paths == DNAS.fast_paths and Listed.fast_paths == (mine,) and Bare.fast_paths == ()
    assert Bare().candidates("cpu", torch.float32) == ["reference"]
    q, k, v, _ = inputs()
    assert Bare().route(Bare().call(q, k, v)) == "reference" and Listed().route(Listed().call(q, k, v)) == "mine"


def test_fast_paths_are_fast_path_objects():
    """A path that could decline at run time (a bare callable returning None) would make `route`
    name a kernel that does not run: refused where the scheme is defined, in one line."""
    with pytest.raises(TypeError, match=r"^Plain\.fast_paths must list FastPath objects .* got <function"):
        class Plain(Normalizer):
            name = "test_plain"
            fast_paths = (lambda normalizer, call: None,)


def test_route_names_the_first_path_that_accepts_the_call_and_asks_it_with_this_normalizer():
    asked = []

    def only_this(normalizer, device, dtype, dropout_p, causal):
        asked.append((normalizer, device, dtype, dropout_p, causal))
        return isinstance(normalizer, Routed) and not causal

    def padded(normalizer, call):
        return call.key_padding_mask is not None

    ran = []
    picky = FastPath("picky", only_this, lambda n, c: ran.append("picky") or c.v)
    plain = FastPath("plain", lambda *a: True, lambda n, c: ran.append("plain") or c.v)

    class Routed(Normalizer):
        name = "test_routed"
        fast_paths = (picky.only(padded), plain, picky)

    r = Routed()
    q, k, v, mask = inputs()
    assert r.candidates("cpu", torch.float32) == ["plain", "picky", "reference"]  # at its last place
    assert asked == [(r, "cpu", torch.float32, 0.0, False)] * 2
    assert r.candidates("cpu", torch.float32, causal=True) == ["plain", "reference"]
    for mask_, expected in ((mask, "picky"), (None, "plain")):
        assert r.route(r.call(q, k, v, mask_)) == expected
        ran.clear()
        r.attend(q, k, v, mask_)
        assert ran == [expected]  # what route names is what runs


def test_attend_hands_a_stacks_mask_cache_to_every_path():
    seen = []

    def spy(normalizer, call):
        seen.append(call.mask_cache)
        return call.v

    class Spied(Normalizer):
        name = "test_spied"
        fast_paths = (FastPath("spy", lambda *a: True, spy),)

        def weights(self, logits: Tensor) -> Tensor:
            return safe_log_normalize(logits, dim=-1).exp()

    q, k, v, _ = inputs()
    cache = object()
    Spied().attend(q, k, v, mask_cache=cache)
    assert seen == [cache]


def test_a_normalizers_attention_weights_default_to_full_attention_and_check_masks():
    q, k, _, mask = inputs(seed=6)
    unas = AttentionSpec("unas").build_normalizer()
    torch.testing.assert_close(unas.attention_weights(q, k),
                               torch.softmax(q @ k.transpose(-2, -1) / 8**0.5, -1))  # no triangle
    for key in ("key_padding_mask", "query_padding_mask"):
        with pytest.raises(ConfigError, match=rf"^{key} must be a bool tensor"):
            unas.attention_weights(q, k, **{key: mask.float()})


def test_every_scheme_knows_its_heads_and_head_schemes_their_sizes():
    from attnlab.attention.schemes import HEAD_SCHEMES

    for name, cls in NORMALIZERS.items():
        assert cls(None, H).num_heads == H and cls().num_heads is None, name
    for name, cls in HEAD_SCHEMES.items():
        default = cls()
        assert (default.num_heads, default.layer_index) == (1, 0) and default.options == cls.Options(), name
        assert default.value_dim == default.head_dim and default.embed_dim == default.head_dim, name
        sized = cls(None, 2, 4, value_dim=6, embed_dim=10, layer_index=3)
        assert (sized.num_heads, sized.head_dim, sized.value_dim, sized.embed_dim, sized.layer_index) == \
            (2, 4, 6, 10, 3), name
        square = cls(None, 3, 4)
        assert (square.value_dim, square.embed_dim) == (4, 12), name


def test_what_runs_are_keyed_by_is_the_unwrapped_name_and_a_bare_scheme_owns_its_parameters():
    from attnlab.attention import query_normalized
    from attnlab.attention.schemes.registry import module_name

    assert module_name("net._fsdp_wrapped_module.layers.0._checkpoint_wrapped_module.self_attn") == \
        "net.layers.0.self_attn"
    hnas = AttentionSpec("hnas").build_normalizer(H)
    assert scheme_parameters(hnas) == [("hybrid_logit", hnas.hybrid_logit)]
    assert query_normalized() == tuple(n for n in sorted(NORMALIZERS) if NORMALIZERS[n].over_queries)
    assert {"dnas", "hnas", "sinkhorn", "esp"} <= set(query_normalized()) and "unas" not in query_normalized()


def test_a_head_scheme_by_default_is_one_head_of_one_feature_whose_own_parameters_train_at_its_rate():
    from attnlab.attention import HeadScheme

    class Bare(HeadScheme):  # what a new head scheme inherits
        name = "test_bare_heads"

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.mix = torch.nn.Linear(2, 2)  # a submodule: the model's weights
            self.scale = torch.nn.Parameter(torch.ones(1))  # held directly: its own

    bare = Bare()
    assert (bare.num_heads, bare.head_dim, bare.value_dim, bare.embed_dim, bare.layer_index) == (1, 1, 1, 1, 0)
    assert bare.scheme_parameters() == [bare.scale]
    with pytest.raises(NotImplementedError):
        bare(AttentionSpec("unas").build_normalizer(), *inputs()[:3])


def test_attention_without_dropout_leaves_the_random_stream_alone():
    """No dropout draws no seed: what a seeded run draws next does not depend on the attention
    calls before it (entmax: its blocked path, and the reference's apply_weights)."""
    q, k, v, mask = inputs(seed=7)
    torch.manual_seed(0)
    expected = torch.rand(3)
    for run in (attend, reference_attend):
        torch.manual_seed(0)
        run(q, k, v, "entmax", key_padding_mask=mask, dropout_p=0.0)
        assert torch.equal(torch.rand(3), expected), run.__name__


def test_a_normalizations_own_options_are_checked_by_name():
    """`normalization_options` go to the normalization unfiltered: an unknown key there is named,
    with the normalization's options (or none)."""
    with pytest.raises(ConfigError, match=r"^model=sigmoid has no option alpah, beta; its options are bias, "
                                          r"bias_init_n, param_lr \(see conf/model/sigmoid\.yaml\)$"):
        AttentionSpec("coda", normalization="sigmoid", normalization_options={"alpah": 2, "beta": 1})
    with pytest.raises(ConfigError, match=r"^model=unas has no option alpha; its options are none "
                                          r"\(see conf/model/unas\.yaml\)$"):
        AttentionSpec("coda", normalization_options={"alpha": 2})


def test_dropout_of_one_drops_every_weight():
    """p = 1 as torch's dropout: all zero, not 1 / (1 - p) (entmax: its blocked path takes p < 1,
    so the reference's apply_weights runs)."""
    q, k, v, mask = inputs(seed=8)
    out = attend(q, k, v, "entmax", key_padding_mask=mask, dropout_p=1.0)
    assert torch.equal(out, torch.zeros_like(out))


def test_a_head_scheme_is_not_run_as_a_normalization():
    q, k, v, _ = inputs()
    with pytest.raises(ConfigError, match=r"^scheme 'diff' computes the heads' outputs itself; it runs inside "
                                          r"MultiHeadAttention \(spec='diff'\) with a normalization, not as one$"):
        attend(q, k, v, "diff")


def test_bad_masks_missing_inputs_and_unknown_names_get_the_whole_fix():
    q, k, v, mask = inputs()
    with pytest.raises(ConfigError, match=r"^key_padding_mask must be a bool tensor \(True = padding\), got "
                                          r"torch\.float32; pass e\.g\. `token_ids == pad_id`$"):
        attend(q, k, v, "unas", key_padding_mask=mask.float())
    with pytest.raises(ConfigError, match=r"^query_padding_mask must be a bool tensor \(True = padding\), got list"):
        attend(q, k, v, "unas", query_padding_mask=mask.tolist())

    class TwoInputs(Normalizer):
        name = "test_two_inputs"
        input_names = ("a", "b")

        def weights(self, logits: Tensor, a: Tensor, b: Tensor) -> Tensor:
            return safe_log_normalize(a * logits + b, dim=-1).exp()

    with pytest.raises(ConfigError, match=r"^scheme='test_two_inputs' needs a, b \(broadcastable to \(B, H, 1, 1\), "
                                          r"e\.g\. a=0\.5\)$"):
        TwoInputs().attend(q, k, v)
    with pytest.raises(ConfigError, match=r"^unknown attention scheme 'nope'; the registered normalizations are "
                                          + ", ".join(sorted(NORMALIZERS)) + r" \(e\.g\. model=hnas\)$"):
        attend(q, k, v, "nope")


def test_inputs_that_are_not_split_into_heads_are_named():
    q, k, v, _ = inputs()
    for name, args in (("q", (q[0], k)), ("k", (q, k[0]))):
        with pytest.raises(ConfigError, match=rf"^{name} must be 4-D \(B, H, S, d\), got shape \(4, 6, 8\); split "
                                              r"heads before calling attend$"):
            attention_weights(*args, "unas")  # no v: q and k alone are checked
        with pytest.raises(ConfigError, match=rf"^{name} must be 4-D \(B, H, S, d\), got shape \(4, 6, 8\)"):
            attend(*args, v, "unas")
    with pytest.raises(ConfigError, match=r"^v must be 4-D \(B, H, S, d\), got shape \(4, 6, 8\)"):
        attend(q, k, v[0], "unas")


@pytest.mark.parametrize("k_shape", [(2, 3, 5, 4), (2, 2, 5, 6), (1, 2, 5, 4)],
                         ids=["heads", "head_dim", "batch"])
def test_q_and_k_of_other_shapes_are_refused_naming_both(k_shape):
    """Any one of B, H or d differing is enough (not only all of them)."""
    from attnlab.attention import attend

    q, k = torch.zeros(2, 2, 3, 4), torch.zeros(k_shape)
    v = torch.zeros(*k_shape[:3], 4)
    with pytest.raises(ConfigError) as err:
        attend(q, k, v, "unas")
    assert str(err.value) == f"q (2, 2, 3, 4) and k {k_shape} must share B, H and head size d"


# ----------------------------------------------------------------------------- the kinds' shared rules
def test_an_option_type_error_gives_the_default_as_the_yaml_writes_it():
    """A string default as written (case kept), a bool one as YAML's true / false."""
    from attnlab.attention.schemes.base import build_options

    @dataclass(frozen=True)
    class Mixed:
        mode: str = "Log_N"
        flag: bool = False

    with pytest.raises(ConfigError, match=r"^model\.mode=3: test's option mode must be str, e\.g\. model\.mode=Log_N$"):
        build_options("test", Mixed, {"mode": 3})
    with pytest.raises(ConfigError, match=r"^model\.flag=1: test's option flag must be bool, e\.g\. model\.flag=false$"):
        build_options("test", Mixed, {"flag": 1})


def test_own_parameters_of_the_wrong_shape_are_refused_naming_the_scheme_and_the_parameter():
    import re

    from attnlab.attention.schemes import SchemeModule

    class Owner(SchemeModule):
        name = "test_owner"

    with pytest.raises(ValueError, match=r"^Owner\.per_head needs num_heads \(a module's scheme\)$"):
        Owner().per_head("p", 0.5)
    owner = Owner(None, 3)
    # either is enough: not 1-D (though one value per head), or 1-D of neither 1 nor 3 values
    for shape in ((1, 3), (2,)):
        with pytest.raises(ValueError, match="^" + re.escape(f"Owner: own parameter 'p' is reported as shape "
                                                             f"{shape}, not one value per head (3)")):
            owner.own("p", torch.zeros(shape), report="p")
    owner.per_head("p", 0.5, report="p")
    owner.p = torch.nn.Parameter(torch.zeros(3, 3))  # swapped for another shape after it was declared
    with pytest.raises(ValueError, match=r"^Owner: own parameter 'p' is reported as shape \(3, 3\)"):
        owner.reported()


def test_own_inputs_reach_the_computation_per_head_as_1_h_1_1_and_others_as_they_are():
    from attnlab.attention.schemes import SchemeModule

    class Owner(SchemeModule):
        name = "test_owner"

    owner = Owner(None, 3)
    owner.per_head("a", 0.5, input="a")
    owner.per_head("l", 0.1, per="layer", input="l")
    owner.own("m", torch.ones(2, 3), input="m")  # not a vector: handed over as it is
    shapes = {name: tuple(t.shape) for name, t in owner.state_inputs().items()}
    assert shapes == {"a": (1, 3, 1, 1), "l": (1, 1, 1, 1), "m": (2, 3)}


def test_a_scheme_that_does_not_cascade_refuses_a_previous_layers_logits():
    from attnlab.attention.schemes import HEAD_SCHEMES
    from attnlab.attention.schemes.base import Heads

    q, k, v, _ = inputs()
    heads = Heads(q, k, v, prev_logits=torch.zeros(2, H, 6, 6))
    unas = AttentionSpec("unas").build_normalizer()
    with pytest.raises(ConfigError, match=r"^attention scheme 'unas' does not cascade, but it was given the "
                                          r"logits of a previous layer$"):
        unas.attend_heads(heads)
    with pytest.raises(ConfigError, match=r"^attention scheme 'diff' does not cascade, but it was given the "
                                          r"logits of a previous layer$"):
        HEAD_SCHEMES["diff"](None, H, 8).attend_heads(unas, heads)


def test_a_head_schemes_own_projections_have_a_bias_by_default_as_the_modules_do():
    from attnlab.attention import HeadScheme
    from attnlab.attention.schemes import HEAD_SCHEMES

    assert HeadScheme().projection_bias is True
    diff = HEAD_SCHEMES["diff"]
    second = diff(diff.Options(version=2), 2, 4)
    assert second.projection_bias is True and second.q2_proj.bias is not None


def test_apply_weights_without_dropout_is_the_product():
    from attnlab.attention.schemes.normalizer import apply_weights

    w = torch.softmax(torch.randn(1, 2, 3, 4), -1)
    v = torch.randn(1, 2, 4, 5)
    torch.testing.assert_close(apply_weights(w, v), w @ v, atol=0, rtol=0)


def test_inputs_integers_in_the_working_dtype_tensors_as_given_numbers_on_the_inputs_device():
    hnas = AttentionSpec("hnas").build_normalizer()
    q, k, v, _ = inputs()
    for u, dtype in ((torch.tensor(1), torch.float32), (1, torch.float32), (0.5, torch.float32),
                     (torch.tensor(0.25, dtype=torch.float64), torch.float64),
                     (torch.tensor(0.5, dtype=torch.bfloat16), torch.bfloat16)):
        assert hnas.call(q, k, v, u=u).inputs["u"].dtype == dtype, u
    wide = [t.double() for t in (q, k, v)]
    assert hnas.call(*wide, u=torch.tensor(1)).inputs["u"].dtype == torch.float64
    assert hnas.call(*wide, u=0.5).inputs["u"].dtype == torch.float64
    meta = [t.to("meta") for t in (q, k, v)]  # a device other than the CPU, without one
    assert hnas.call(*meta, u=0.5).inputs["u"].device.type == "meta"


def test_a_reported_quantity_is_labelled_by_its_scheme_whatever_underscores_it_holds():
    from typing import ClassVar

    from attnlab.attention.schemes import reported_label

    assert reported_label("diff_lambda") == "lambda (weight of the second map)"
    assert reported_label("hnas_u") == "u (weight of DNAS)"
    assert reported_label("gate_mean") == "gate mean"  # not a registered scheme: "<scheme> <name>"
    assert reported_label("gate_per_head") == "gate per_head"  # (up to its first "_")

    class Short(Normalizer):
        name = "test_two"
        reported_labels: ClassVar[dict[str, str]] = {"words_log_t": "not this one"}

    class Long(Normalizer):  # a name with "_" in it, and a reported name with "_" in it
        name = "test_two_words"
        reported_labels: ClassVar[dict[str, str]] = {"log_t": "log t (a temperature)"}

    register(Short)
    register(Long)
    try:
        assert reported_label("test_two_words_log_t") == "log t (a temperature)"
        assert reported_label("test_two_words_other_name") == "test_two_words other_name"
        assert reported_label("test_two_other") == "test_two other"
    finally:
        unregister("test_two")
        unregister("test_two_words")

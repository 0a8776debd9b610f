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
    register,
    scheme_parameters,
)
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
    from attnlab.runner import scheme_params
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

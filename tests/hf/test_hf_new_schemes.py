"""attnlab.hf with the schemes whose rows need not sum to 1 or that learn a per-head parameter
(sigmoid, sink, softpick, ssmax) and the causal-only one (stickbreaking), on the packaged 6-layer
BERT: each trains (forward and backward with padding, no NaN); its own parameters are created per
attention module like HNAS's u, train and round-trip through save_pretrained; the sink with a
very negative logit and SSMax with c log n = 1 equal UNAS; the recorded weights equal the
authors' formulas written out here; stickbreaking is refused in an encoder in one line and runs
in a causal decoder."""

from __future__ import annotations

import copy
import functools
import math

import pytest
import torch

from attnlab.attention import record_attention, scheme_parameters
from attnlab.errors import ConfigError
from attnlab.hf import SchemeAttention, from_pretrained, use_scheme
from tasks.common import bert_assets

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread is faster on shared cores



@functools.cache
def _loaded():
    return transformers.BertModel.from_pretrained(
        str(bert_assets.bert_dir()), add_pooling_layer=False, attn_implementation="eager").eval()


def packaged_bert():
    """A fresh copy of the packaged BERT (loaded once: copying is faster than loading)."""
    return copy.deepcopy(_loaded())


def tiny_bert():
    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, vocab_size=64, initializer_range=0.5)
    return transformers.BertModel(config, add_pooling_layer=False).eval()


def tiny_gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=32,
                                     attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0, bos_token_id=0,
                                     eos_token_id=0, attn_implementation="eager")
    return transformers.GPT2Model(config).eval()


# (scheme, options, the parameter each attention module owns: None if none)
SCHEMES = [("sigmoid", {}, None), ("sigmoid", {"bias": "learned"}, "bias"), ("sink", {}, "sink"),
           ("softpick", {}, None), ("ssmax", {}, "scale")]


def batch(length=12, padded=True):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 20000, (3, length), generator=gen)
    mask = torch.ones(3, length, dtype=torch.long)
    if padded:
        mask[1, 8:] = 0
        mask[2, 4:] = 0
    ids[mask == 0] = bert_assets.PAD_ID
    return ids, mask


@pytest.mark.parametrize(("scheme", "options", "param"), SCHEMES)
def test_each_scheme_trains_in_the_packaged_bert_with_padding(scheme, options, param):
    model = use_scheme(packaged_bert(), scheme, **options).train()
    ids, mask = batch()
    out = model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert torch.isfinite(out).all()
    (out[mask.bool()] * torch.linspace(-1, 1, out.shape[-1])).sum().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    own = scheme_parameters(model)
    adapters = [m for m in model.modules() if isinstance(m, SchemeAttention)]
    if param is None:
        assert own == []
        return
    # one parameter per attention module (6 layers), one value per head, found by type
    assert len(own) == len(adapters) == 6
    assert all(name.endswith(f".attnlab.normalizer.{param}") and p.shape == (12,) for name, p in own)
    assert {id(p) for _, p in own} <= {id(p) for p in model.parameters()}
    assert all(float(p.grad.abs().max()) > 0 for _, p in own)


@pytest.mark.parametrize(("scheme", "options", "param"), [s for s in SCHEMES if s[2]])
def test_the_schemes_parameters_train_and_round_trip(tmp_path, scheme, options, param):
    ids, mask = batch(length=7)
    ids = ids % 64
    model = use_scheme(tiny_bert(), scheme, **options).train()
    own = [p for _, p in scheme_parameters(model)]
    assert len(own) == 2 and all(p.shape == (4,) for p in own)
    target = torch.randn(32, generator=torch.Generator().manual_seed(1))
    (model(input_ids=ids, attention_mask=mask).last_hidden_state @ target).sum().backward()
    before = [p.detach().clone() for p in own]
    torch.optim.SGD(model.parameters(), lr=1.0).step()
    assert all(not torch.equal(b, p) for b, p in zip(before, own))
    model.eval()
    want = model(input_ids=ids, attention_mask=mask).last_hidden_state
    model.save_pretrained(tmp_path)
    loaded = from_pretrained(transformers.BertModel, tmp_path, add_pooling_layer=False).eval()
    assert loaded.config.attnlab["scheme"] == scheme
    for (name, p), (name2, q) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert name == name2 and torch.equal(p, q), name
    assert torch.equal(loaded(input_ids=ids, attention_mask=mask).last_hidden_state, want)


@pytest.mark.parametrize(("scheme", "options", "padded"), [
    ("sink", {"learned": False, "sink_init": -60.0}, True),  # exp(-60) next to sum exp(s) >= ~e^-20
    ("ssmax", {"learned": False, "scale_init": 1 / math.log(12)}, False),  # c log n = 1 at n = 12
])
def test_limits_that_equal_unas(scheme, options, padded):
    ids, mask = batch(padded=padded)
    with torch.no_grad():
        unas = use_scheme(packaged_bert(), "unas")(input_ids=ids, attention_mask=mask).last_hidden_state
        got = use_scheme(packaged_bert(), scheme, **options)(input_ids=ids, attention_mask=mask).last_hidden_state
    real = mask.bool()
    assert (got - unas)[real].abs().max() < 1e-4


def _recorded(model, ids, mask):
    """{module name: (recorded weights, the scores q k^T / sqrt(d) it was given)}."""
    heads = {}
    hooks = [m.register_forward_pre_hook(lambda mod, args, n=name: heads.__setitem__(n, args[:2]))
             for name, m in model.named_modules() if isinstance(m, SchemeAttention)]
    with torch.no_grad(), record_attention(model) as recorder:
        model(input_ids=ids, attention_mask=mask)
    for h in hooks:
        h.remove()
    out = {}
    for name, (q, k) in heads.items():
        out[name] = recorder.records[name].weights.double(), (q @ k.transpose(-1, -2)).double() / math.sqrt(q.shape[-1])
    return out


def test_recorded_weights_equal_the_authors_formulas():
    ids, mask = batch()
    key = mask.bool()[:, None, None, :]  # (B, 1, 1, S_k) valid keys
    n = key.sum(-1, keepdim=True).double()  # valid keys per row
    query = mask.bool()[:, None, :, None]  # padded queries (padded tokens) get all-zero rows
    sigmoid = use_scheme(packaged_bert(), "sigmoid").eval()
    for name, (w, s) in _recorded(sigmoid, ids, mask).items():
        want = torch.sigmoid(s - n.log()) * key * query  # Ramapuram et al.: sigmoid(s + b), b = -log n
        torch.testing.assert_close(w, want, atol=1e-6, rtol=1e-5, msg=name)
    sink = use_scheme(packaged_bert(), "sink").eval()
    with torch.no_grad():
        for m in sink.modules():
            if isinstance(m, SchemeAttention):
                m.normalizer.sink.copy_(torch.linspace(-2, 3, 12))
    b = torch.linspace(-2, 3, 12).double()[None, :, None, None]
    for name, (w, s) in _recorded(sink, ids, mask).items():
        e = s.exp() * key
        want = e / (b.exp() + e.sum(-1, keepdim=True)) * query  # gpt-oss: exp(s) / (exp(b) + sum exp(s))
        torch.testing.assert_close(w, want, atol=1e-6, rtol=1e-5, msg=name)


def test_stickbreaking_is_refused_in_an_encoder_in_one_line_and_runs_in_a_decoder():
    with pytest.raises(ConfigError) as err:
        use_scheme(packaged_bert(), "stickbreaking")
    message = str(err.value)
    assert "\n" not in message and "causal attention only" in message
    assert "model=unas" in message and "model=stickbreaking" not in message.split("one of")[-1]
    ids = torch.randint(1, 64, (2, 7), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 5:] = 0
    model = use_scheme(tiny_gpt2(), "stickbreaking")
    out = model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert torch.isfinite(out[mask.bool()]).all()

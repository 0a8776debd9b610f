"""attnlab.hf on small random transformers models built locally (no download): causal models
refuse the schemes that normalize over queries in one line and run UNAS exactly as HF does;
HNAS's u is a parameter that trains and survives save_pretrained / from_pretrained and a state
dict round trip exactly; attention dropout follows the model's config."""

from __future__ import annotations

import pytest
import torch

from attnlab.attention import scheme_parameters
from attnlab.errors import ConfigError
from attnlab.hf import SchemeAttention, from_pretrained, use_scheme

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread is faster on shared cores


def tiny_gpt2(implementation="eager"):
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=32,
                                     attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0, bos_token_id=0,
                                     eos_token_id=0, attn_implementation=implementation)
    return transformers.GPT2Model(config).eval()


def tiny_llama(implementation="eager"):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                                      attn_implementation=implementation)
    return transformers.LlamaModel(config).eval()


def tiny_bert(**config):
    """Weights large enough (initializer_range) that attention is far from uniform, where DNAS
    and UNAS would coincide and u would get no gradient."""
    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, vocab_size=64, initializer_range=0.5,
                                     **config)
    return transformers.BertModel(config, add_pooling_layer=False).eval()


def inputs(batch=2, length=7):
    ids = torch.randint(1, 64, (batch, length), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[1, 5:] = 0
    return ids, mask


@pytest.mark.parametrize("scheme", ["dnas", "hnas", "sinkhorn"])
@pytest.mark.parametrize("build", [tiny_gpt2, tiny_llama])
def test_causal_models_refuse_over_queries_schemes_in_one_line(build, scheme):
    with pytest.raises(ConfigError) as err:
        use_scheme(build(), scheme)
    message = str(err.value)
    assert "\n" not in message and scheme in message and "leak the future" in message
    assert "unas" in message  # names the schemes that fit


@pytest.mark.parametrize("build", [tiny_gpt2, tiny_llama])
def test_causal_unas_equals_hf_eager_with_padding(build):
    """Causal self-attention, right padding, and (Llama) grouped-query heads."""
    ids, mask = inputs()
    want = build()(input_ids=ids, attention_mask=mask).last_hidden_state
    model = use_scheme(build(), "unas")
    assert all(m.role == "decoder" for m in model.modules() if isinstance(m, SchemeAttention))
    got = model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert (got - want)[mask.bool()].abs().max() < 1e-5


def test_cascading_schemes_are_refused():
    with pytest.raises(ConfigError, match="passes logits from layer to layer"):
        use_scheme(tiny_bert(), "coda")


def test_hnas_u_is_a_parameter_that_trains_and_round_trips(tmp_path):
    ids, mask = inputs()
    model = use_scheme(tiny_bert(), "hnas", hybrid_init=0.3)
    u = [p for _, p in scheme_parameters(model)]
    assert len(u) == 2 and all(p.shape == (4,) for p in u)  # one u per head, per layer
    assert {id(p) for p in u} <= {id(p) for p in model.parameters()}
    torch.testing.assert_close(torch.sigmoid(u[0]), torch.full((4,), 0.3))
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    # a random projection: the mean square of LayerNorm's output would be constant
    target = torch.randn(32, generator=torch.Generator().manual_seed(1))
    (model(input_ids=ids, attention_mask=mask).last_hidden_state @ target).sum().backward()
    assert all(float(p.grad.abs().min()) > 1e-4 for p in u)
    before = [p.detach().clone() for p in u]
    optimizer.step()
    assert all(not torch.equal(b, p) for b, p in zip(before, u))
    model.eval()
    want = model(input_ids=ids, attention_mask=mask).last_hidden_state

    model.save_pretrained(tmp_path)
    loaded = from_pretrained(transformers.BertModel, tmp_path, add_pooling_layer=False).eval()
    assert loaded.config._attn_implementation == "attnlab" and loaded.config.attnlab["scheme"] == "hnas"
    for (name, p), (name2, q) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert name == name2 and torch.equal(p, q), name
    assert torch.equal(loaded(input_ids=ids, attention_mask=mask).last_hidden_state, want)

    fresh = use_scheme(tiny_bert(), "hnas")
    fresh.load_state_dict(model.state_dict())  # attnlab's checkpoints are state dicts
    assert torch.equal(fresh.eval()(input_ids=ids, attention_mask=mask).last_hidden_state, want)


def test_attention_dropout_follows_the_models_config():
    ids, mask = inputs()
    for p, differs in ((0.5, True), (0.0, False)):
        model = use_scheme(tiny_bert(hidden_dropout_prob=0.0, attention_probs_dropout_prob=p), "dnas")
        evaluated = model.eval()(input_ids=ids, attention_mask=mask).last_hidden_state
        trained = model.train()(input_ids=ids, attention_mask=mask).last_hidden_state
        assert bool((trained - evaluated)[mask.bool()].abs().max() > 1e-3) == differs


def test_a_model_without_the_attention_interface_is_refused():
    with pytest.raises(ConfigError, match="AttentionInterface"):
        use_scheme(torch.nn.Sequential(torch.nn.Linear(2, 2)), "unas")

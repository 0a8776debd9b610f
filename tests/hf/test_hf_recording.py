"""attnlab's recording and analyses see a transformers model's attention: record_attention gives
each layer's weights as the scheme's reference computes them from that layer's q and k,
scheme_values finds u, and HeadImportance's masked head zeroes exactly that head."""

from __future__ import annotations

import pytest
import torch

from attnlab.attention import (
    attention_modules,
    attention_weights,
    record_attention,
    scheme_values,
)
from attnlab.callbacks.head_importance import masked_head
from attnlab.hf import SchemeAttention, use_scheme

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread is faster on shared cores


def tiny_bert():
    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, vocab_size=64, initializer_range=0.5)
    return transformers.BertModel(config, add_pooling_layer=False).eval()


def batch():
    ids = torch.randint(1, 64, (2, 9), generator=torch.Generator().manual_seed(5))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[0, 6:] = 0
    return ids, mask


@pytest.mark.parametrize("scheme", ["unas", "dnas", "hnas"])
def test_record_attention_sees_every_layer_with_the_schemes_weights(scheme):
    model = use_scheme(tiny_bert(), scheme)
    ids, mask = batch()
    heads = {}  # the q, k each SchemeAttention is given
    hooks = [m.register_forward_pre_hook(lambda mod, args, n=name: heads.__setitem__(n, args[:2]))
             for name, m in attention_modules(model)]
    with record_attention(model) as recorder:
        model(input_ids=ids, attention_mask=mask)
    for h in hooks:
        h.remove()
    names = [name for name, _ in attention_modules(model)]
    assert names == [f"encoder.layer.{i}.attention.self.attnlab" for i in range(2)]
    assert set(recorder.records) == set(names)
    padding = mask == 0
    for name, m in attention_modules(model):
        record = recorder.records[name]
        assert torch.equal(record.key_padding_mask, padding) and torch.equal(record.query_padding_mask, padding)
        u = {"u": m.normalizer.state_inputs()["u"]} if scheme == "hnas" else {}
        want = attention_weights(*heads[name], scheme, padding, padding, **u)
        torch.testing.assert_close(record.weights, want, atol=1e-6, rtol=1e-5)
        assert record.column_sums.shape == (2, 4, 9)


def test_scheme_values_name_the_hf_layers():
    model = use_scheme(tiny_bert(), "hnas", hybrid_init=0.2, hybrid_per="layer")
    found = scheme_values(model)["hnas_u"]
    assert list(found) == [f"encoder.layer.{i}.attention.self.attnlab" for i in range(2)]
    assert all(torch.allclose(u, torch.full((4,), 0.2)) for u in found.values())


def test_masked_head_zeroes_that_heads_output():
    model = use_scheme(tiny_bert(), "unas")
    ids, mask = batch()
    _, module = attention_modules(model)[1]
    assert isinstance(module, SchemeAttention)
    outputs = []
    full = model(input_ids=ids, attention_mask=mask).last_hidden_state
    with masked_head(module, 2):
        hook = module.register_forward_hook(lambda _m, _a, out: outputs.append(out))
        masked = model(input_ids=ids, attention_mask=mask).last_hidden_state
        hook.remove()
    heads = outputs[0].view(2, 9, 4, 8)
    assert float(heads[:, :, 2].abs().max()) == 0.0 and float(heads[:, :, 1].abs().max()) > 0
    assert float((masked - full).abs().max()) > 1e-4

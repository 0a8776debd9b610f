"""Shared incremental decoding (tasks.common.incremental): a step with cached keys/values equals
the full causal pass, for decoder-only stacks and every scheme that runs in causal attention
(the cascades of CODA and RealFormer carried row by row)."""

import pytest
import torch
from torch import nn

from attnlab.attention import AttentionSpec, TransformerEncoderLayer, names, run_stack
from tasks.common.incremental import KVCache, cacheable, causal_layer_step

D, H = 16, 4
CAUSAL = [n for n in names() if not AttentionSpec.from_config(n).normalizes_over_queries]


@pytest.mark.parametrize("scheme", CAUSAL)
@pytest.mark.parametrize("norm_first", [False, True])
def test_causal_stack_steps_equal_the_full_pass(scheme, norm_first):
    torch.manual_seed(0)
    layers = nn.ModuleList(TransformerEncoderLayer(D, H, 32, 0.0, spec=scheme, causal=True,
                                                   norm_first=norm_first, layer_index=i)
                           for i in range(2)).eval()
    x = torch.randn(2, 6, D)
    with torch.no_grad():
        full = run_stack(layers, x)
        if not cacheable(layers):  # cascades (coda, realformer): only when the step carries logits
            assert AttentionSpec.from_config(scheme).transform is not None and cacheable(layers, cascades=True)
            with pytest.raises(ValueError, match="cascade"):
                causal_layer_step(layers[0], x[:, :1], KVCache(), 0)
        cache = KVCache()
        for t in range(6):
            y, logits = x[:, t : t + 1], None  # the newest row of cascade logits, layer to layer
            for index, layer in enumerate(layers):
                y, logits = causal_layer_step(layer, y, cache, index, prev_logits=logits, return_logits=True)
            torch.testing.assert_close(y[:, 0], full[:, t], atol=1e-5, rtol=1e-5)
        cache.select(torch.tensor([1, 1, 0]))
        assert cache.self_keys[0].shape[0] == 3 and torch.equal(cache.self_keys[0][0], cache.self_keys[0][1])


def test_a_non_causal_layer_is_refused():
    layer = TransformerEncoderLayer(D, H, 32, spec="unas").eval()
    with pytest.raises(ValueError, match="causal"):
        causal_layer_step(layer, torch.randn(1, 1, D), KVCache(), 0)

"""Incremental decoding in the library (attnlab.attention.kv_cache, the layers' `step`): a step
with cached keys/values equals the full causal pass, for decoder-only stacks, encoder-decoder
stacks and every scheme that runs in causal attention (the cascades of CODA and RealFormer carried
row by row); a transform that does not declare itself row-wise decodes by re-running the prefix."""

import pytest
import torch
from torch import nn

from attnlab.attention import (
    AttentionSpec,
    DecoderCache,
    KVCache,
    TransformerDecoderLayer,
    TransformerEncoderLayer,
    cacheable,
    names,
    run_stack,
    step_stack,
)

D, H = 16, 4
CAUSAL = [n for n in names() if not AttentionSpec.from_config(n).normalizes_over_queries]
# a decoder's cross-attention is not causal: causal-only schemes (selective) cannot run there
DECODER = [n for n in CAUSAL if not AttentionSpec.from_config(n).causal_only]


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
        if not cacheable(layers, cascades=True):  # selective: decoding re-runs the prefix
            with pytest.raises(ValueError, match="PrefixCache"):
                layers[0].step(x[:, :1], KVCache(), 0, return_logits=True)
            for t in range(6):  # the prefix's newest row is the full pass's row: exact
                torch.testing.assert_close(run_stack(layers, x[:, : t + 1])[:, t], full[:, t],
                                           atol=1e-5, rtol=1e-5)
            return
        if not cacheable(layers):  # cascades (coda, realformer): only when the step carries logits
            assert AttentionSpec.from_config(scheme).transform is not None and cacheable(layers, cascades=True)
            with pytest.raises(ValueError, match="cascade"):
                layers[0].step(x[:, :1], KVCache(), 0)
        cache = KVCache()
        for t in range(6):
            y, logits = x[:, t : t + 1], None  # the newest row of cascade logits, layer to layer
            for index, layer in enumerate(layers):
                y, logits = layer.step(y, cache, index, prev_logits=logits, return_logits=True)
            torch.testing.assert_close(y[:, 0], full[:, t], atol=1e-5, rtol=1e-5)
        cache.select(torch.tensor([1, 1, 0]))
        assert cache.self_keys[0].shape[0] == 3 and torch.equal(cache.self_keys[0][0], cache.self_keys[0][1])


def test_a_non_causal_layer_is_refused():
    layer = TransformerEncoderLayer(D, H, 32, spec="unas").eval()
    with pytest.raises(ValueError, match="causal"):
        layer.step(torch.randn(1, 1, D), KVCache(), 0)


@pytest.mark.parametrize("scheme", DECODER)
@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_stack_steps_equal_the_full_pass_also_after_reordering(scheme, norm_first):
    # encoder-decoder layers: the source's keys/values projected once (DecoderCache.start), the
    # self-attention's cached; beam search's reordering (select) moves both
    torch.manual_seed(0)
    layers = nn.ModuleList(TransformerDecoderLayer(D, H, 32, 0.0, spec=scheme, norm_first=norm_first,
                                                   layer_index=i) for i in range(2)).eval()
    x, memory = torch.randn(3, 5, D), torch.randn(3, 7, D)
    memory_mask = torch.zeros(3, 7, dtype=torch.bool)
    memory_mask[1, 4:] = True
    with torch.no_grad():
        full = run_stack(layers, x, memory, memory_key_padding_mask=memory_mask)
        cache = DecoderCache.start(layers, memory, memory_mask)
        for t in range(4):
            torch.testing.assert_close(step_stack(layers, x[:, t : t + 1], cache)[:, 0], full[:, t],
                                       atol=1e-5, rtol=1e-5)
        order = torch.tensor([2, 0, 1])
        cache.select(order)
        expected = run_stack(layers, x[order], memory[order], memory_key_padding_mask=memory_mask[order])
        torch.testing.assert_close(step_stack(layers, x[order][:, 4:5], cache)[:, 0], expected[:, 4],
                                   atol=1e-5, rtol=1e-5)
        assert cache.length == 5


def test_a_new_transform_is_not_cached_row_by_row_unless_it_says_so():
    # the safe default: a transform that does not declare `row_wise` decodes by re-running the
    # prefix, with no edit anywhere else
    from attnlab.attention.schemes import LogitTransform, register, unregister

    @register
    class Squared(LogitTransform):  # not row-wise in general (it only looks the part)
        name = "squared_for_test"

        def forward(self, scores, previous):
            return scores if previous is None else scores + previous**2

    try:
        layers = [TransformerEncoderLayer(D, H, 32, 0.0, spec="squared_for_test", causal=True,
                                          layer_index=i) for i in range(2)]
        assert not cacheable(layers, cascades=True)
        with pytest.raises(ValueError, match="cascade"):
            layers[0].eval().step(torch.randn(1, 1, D), KVCache(), 0, return_logits=True)
        Squared.row_wise = True  # declared: cached, with the rows carried
        assert cacheable(layers, cascades=True) and not cacheable(layers)
    finally:
        unregister("squared_for_test")


def test_the_key_value_buffer_grows_and_keeps_every_position():
    cache = KVCache()
    kv = cache.self_attention(0)
    steps = [torch.randn(2, H, 1, 4) for _ in range(20)]  # past the first capacity, twice
    for t, k in enumerate(steps):
        keys, values = kv.append(k, -k)
        assert keys.shape == values.shape == (2, H, t + 1, 4) and cache.length == t + 1
    torch.testing.assert_close(kv.keys, torch.cat(steps, dim=2), rtol=0, atol=0)
    torch.testing.assert_close(kv.values, -torch.cat(steps, dim=2), rtol=0, atol=0)
    with pytest.raises(ValueError, match="one position per step"):
        TransformerEncoderLayer(D, H, 32, causal=True).eval().step(torch.randn(1, 2, D), cache, 1)

"""Running a stack of layers with the cascade logits passed explicitly.

    x = run_stack(self.layers, x, key_padding_mask)                  # encoder layers
    y = run_stack(self.decoder_layers, y, memory, tgt_mask, mem_mask) # decoder layers
    x = run_stack(self.layers, x, mask, checkpoint=True)             # activation checkpointing
    x = run_stack(self.layers, x, mask, start=s)                     # rows at positions s, s + 1, ...
    y = step_stack(self.layers, y_new, cache)                        # one new position, cached

Each layer returns its output and the logits its attentions pass on (CODA, RealFormer); the
next layer takes them as `prev_logits`. Nothing is stored on the modules, so any container works
(a list, an nn.ModuleList, or nn.Sequential with `StackCarry`), and recomputation under
`torch.utils.checkpoint` sees exactly the same inputs (its RNG state is restored, so CODA's
noise is redrawn identically).

The FlexAttention block masks (CUDA) travel the same way: `run_stack` makes one `MaskCache` per
forward and hands it to every layer, so that they are built at the first layer and reused by the
others; the next forward (a new padding mask) gets a new cache, so none is ever stale. `step_stack`
makes one per step (the decoder's cross-attention masks the source's padding at every layer).

`step_stack` is the incremental form: the newest position (B, 1, D) through each layer's `step`
with the keys/values of the earlier ones in a cache (attnlab.attention.kv_cache); the newest
position's row of cascade logits goes from layer to layer the same way. Positions inside
attention (RoPE, ALiBi: attnlab.attention.positions) travel explicitly too: `run_stack`'s
`start` (default 0) goes to every layer; a step's position is its cache's length.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
import torch.utils.checkpoint
from torch import Tensor, nn

from attnlab.attention.kernels.flex import MaskCache

if TYPE_CHECKING:
    from attnlab.attention.kv_cache import KVCache


def run_stack(layers: Iterable[nn.Module], x: Tensor, *args, checkpoint: bool = False, **kwargs) -> Tensor:
    """Apply `layers` in order to x (extra arguments go to every layer); returns the output."""
    logits, masks = None, MaskCache()
    for layer in layers:
        if checkpoint and torch.is_grad_enabled():
            x, logits = torch.utils.checkpoint.checkpoint(
                layer, x, *args, prev_logits=logits, return_logits=True, mask_cache=masks,
                use_reentrant=False, **kwargs)
        else:
            x, logits = layer(x, *args, prev_logits=logits, return_logits=True, mask_cache=masks,
                              **kwargs)
    return x


def step_stack(layers: Iterable[nn.Module], x: Tensor, cache: KVCache) -> Tensor:
    """The newest position x (B, 1, D) through `layers` (their `step`), layer i using entry i of
    `cache` (a `KVCache`, or a `DecoderCache` for decoder layers); returns the output (B, 1, D).
    Eval mode; equals the last position of `run_stack` over the whole prefix."""
    logits, masks = None, MaskCache()
    for index, layer in enumerate(layers):
        x, logits = layer.step(x, cache, index, prev_logits=logits, return_logits=True,
                               mask_cache=masks)
    return x

"""attnlab schemes through transformers' attention interface, on the packaged 6-layer BERT: UNAS
equals HF's own eager and SDPA attention (hidden states and gradients, with padding); the other
schemes equal attnlab's materialized reference run in the same model."""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from attnlab.hf import use_scheme
from tasks.common import bert_assets

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread is faster on shared cores


@functools.cache
def _loaded(implementation: str):
    return transformers.BertModel.from_pretrained(
        str(bert_assets.bert_dir()), add_pooling_layer=False, attn_implementation=implementation).eval()


def packaged_bert(implementation: str = "eager"):
    """A fresh copy of the packaged BERT (loaded once: copying is faster than loading)."""
    return copy.deepcopy(_loaded(implementation))


@pytest.fixture(scope="module")
def batch():
    """Three sentences of 14, 9 and 5 tokens (right padding)."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 20000, (3, 14), generator=gen)
    mask = torch.ones(3, 14, dtype=torch.long)
    mask[1, 9:] = 0
    mask[2, 5:] = 0
    ids[mask == 0] = bert_assets.PAD_ID
    return ids, mask


def hidden_and_grads(model, ids, mask):
    """Hidden states at the real tokens and the gradients of a fixed projection of them (padded
    positions are garbage in any implementation and must not reach the real ones)."""
    model.zero_grad()
    out = model(input_ids=ids, attention_mask=mask).last_hidden_state[mask.bool()]
    weights = torch.linspace(-1, 1, out.shape[-1])
    (out * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.detach(), grads


def assert_gradients_close(got: dict, want: dict, tolerance: float = 1e-5) -> None:
    """Each gradient to `tolerance` of its tensor's scale (at least 1): float32 sums over 384-wide
    rows differ in the last bits, and some gradients are exactly 0 in theory (key biases, which
    softmax ignores) and rounding noise in both implementations."""
    for name, grad in want.items():
        scale = max(float(grad.abs().max()), 1.0)
        diff = float((got[name] - grad).abs().max())
        assert diff <= tolerance * scale, f"{name}: gradients differ by {diff:.3g} (scale {scale:.3g})"


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_unas_through_the_interface_equals_hf_attention(batch, implementation):
    ids, mask = batch
    reference = packaged_bert(implementation)
    ours = use_scheme(packaged_bert(implementation), "unas")
    assert ours.config._attn_implementation == "attnlab"
    want, want_grads = hidden_and_grads(reference, ids, mask)
    got, got_grads = hidden_and_grads(ours, ids, mask)
    assert (got - want).abs().max() < 1e-5
    assert set(got_grads) == set(want_grads)  # UNAS adds no parameters
    assert_gradients_close(got_grads, want_grads)


def register_reference(padding: torch.Tensor) -> str:
    """An attention implementation running each module's scheme on attnlab's materialized
    reference, with key and query padding taken from the 2-D mask itself (not from HF's 4-D
    mask, which the code under test converts)."""
    from transformers import AttentionInterface

    def reference(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **_):
        norm = module.attnlab.normalizer
        out = norm.reference(norm.call(query, key, value, padding, padding, False, 0.0))
        return out.transpose(1, 2), None

    AttentionInterface.register("attnlab_test_reference", reference)
    return "attnlab_test_reference"


@pytest.mark.parametrize("scheme, options", [("dnas", {}), ("hnas", {}), ("sinkhorn", {"n_iter": 3}),
                                             ("entmax", {"alpha": 1.5})])
def test_other_schemes_equal_attnlabs_reference(batch, scheme, options):
    ids, mask = batch
    model = use_scheme(packaged_bert(), scheme, **options)
    if scheme == "hnas":  # a different u in every head and layer
        gen = torch.Generator().manual_seed(1)
        for name, p in model.named_parameters():
            if name.endswith("hybrid_logit"):
                p.data = torch.randn(p.shape, generator=gen)
    got, got_grads = hidden_and_grads(model, ids, mask)
    model.set_attn_implementation(register_reference(mask == 0))
    want, want_grads = hidden_and_grads(model, ids, mask)
    assert (got - want).abs().max() < 1e-5
    # entmax's blocked path finds its threshold by Newton steps, the reference by bisection: in
    # float32 both sit ~3e-6 from float64 (test_entmax_blocks), apart by up to twice that
    assert_gradients_close(got_grads, want_grads, 2e-5 if scheme == "entmax" else 1e-5)
    unas = packaged_bert()(input_ids=ids, attention_mask=mask).last_hidden_state[mask.bool()]
    assert (got - unas).abs().max() > 1e-2  # the scheme did change the model

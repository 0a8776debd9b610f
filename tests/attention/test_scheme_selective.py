"""Selective attention (Leviathan et al., ICLR 2025): parity with a re-statement of the paper's
sketch (its Figure 2; x-transformers' `selective_attn`) through a full MultiHeadAttention, values
and gradients, under causal masking and padding; a constructed example where a token masks another
from the queries after it; the one-line refusal outside causal attention (layer, runner, registry);
decoding by re-running the prefix; `train.py task=lm model=selective`."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.cards import TINY
from helpers.cli import QUIET, metrics_files, run_here
from omegaconf import OmegaConf

from attnlab.attention import AttentionSpec, MultiHeadAttention
from attnlab.attention.schemes import TRANSFORMS, fitting
from attnlab.errors import ConfigError
from attnlab.runner import check_scheme_fits_task

E, H, S = 12, 3, 7


def paper_selective_logits(logits: torch.Tensor, exempt_bos: bool = True) -> torch.Tensor:
    """The paper's sketch on logits (B, H, n, n) that are -inf where masked: head 0 through a ReLU,
    the BOS column and the diagonal zeroed, rolled one query down (row 0 zeroed), summed down the
    queries, subtracted from every head."""
    n = logits.shape[-1]
    s = torch.relu(logits[:, 0]).clone()
    if exempt_bos:
        s[..., 0] = 0
    s = (1 - torch.eye(n, dtype=s.dtype)) * s
    s = torch.roll(s, 1, dims=-2)
    s[..., 0, :] = 0
    return logits - s.cumsum(dim=-2)[:, None]


def reference_mha(m: MultiHeadAttention, x, key_padding_mask, exempt_bos=True):
    """The whole attention by hand: projections, causal + padding masks, selective logits,
    softmax (rows without any key: 0), out_proj."""
    b, n, _ = x.shape
    split = lambda t: t.view(b, n, H, E // H).transpose(1, 2)
    q, k, v = split(m.q_proj(x)), split(m.k_proj(x)), split(m.v_proj(x))
    logits = q @ k.transpose(-1, -2) / math.sqrt(E // H)
    valid = torch.ones(n, n, dtype=torch.bool).tril()[None, None]
    valid = valid & ~key_padding_mask[:, None, None, :] & ~key_padding_mask[:, None, :, None]
    logits = paper_selective_logits(logits.masked_fill(~valid, float("-inf")), exempt_bos)
    any_key = valid.any(-1, keepdim=True)
    weights = torch.softmax(logits.masked_fill(~any_key, 0.0), dim=-1) * any_key
    return m.out_proj((weights @ v).transpose(1, 2).reshape(b, n, E))


def padded_batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, S, E, generator=g, dtype=torch.float64) * 2  # sizeable logits: real masking
    mask = torch.zeros(3, S, dtype=torch.bool)
    mask[1, -3:] = True  # right padding
    mask[2, :2] = True  # left padding (key 0 is a pad there)
    return x, mask


@pytest.mark.parametrize("exempt_bos", [True, False])
def test_values_and_gradients_equal_the_papers_computation(exempt_bos):
    torch.manual_seed(0)
    m = MultiHeadAttention(E, H, spec={"scheme": "selective", "exempt_bos": exempt_bos}).double()
    x, mask = padded_batch()
    ours_x, ref_x = x.clone().requires_grad_(), x.clone().requires_grad_()
    ours = m(ours_x, key_padding_mask=mask, query_padding_mask=mask, causal=True)
    ref = reference_mha(m, ref_x, mask, exempt_bos)
    rows = ~mask[..., None]  # padded queries: 0 in ours, whatever the reference leaves
    torch.testing.assert_close(ours * rows, ref * rows, atol=1e-10, rtol=1e-10)
    g = torch.randn_like(ours) * rows
    params = [p for p in m.parameters()]
    grads = torch.autograd.grad((ours * g).sum(), [ours_x, *params])
    ref_grads = torch.autograd.grad((ref * g).sum(), [ref_x, *params])
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)
    # the selection is not a no-op here, and it is gone with one head's logits all <= 0
    plain = MultiHeadAttention(E, H, spec="unas").double()
    plain.load_state_dict(m.state_dict())
    assert not torch.allclose(plain(x, key_padding_mask=mask, causal=True) * rows, ours * rows)


def constructed(d=2):
    """q, k, v (1, 2, 5, d): key 1 is what every query of head 1 likes; head 0's query 2 (and
    only it, besides query 1 on itself and query 3 on BOS) selects strongly."""
    q, k = torch.zeros(1, 2, 5, d), torch.zeros(1, 2, 5, d)
    k[:, :, 1, 0] = 1.0
    k[:, :, 0, 1] = 1.0
    q[:, 1, :, 0] = 2.0  # head 1: key 1 scores 2/sqrt(2) for every query, the others 0
    q[:, 0, 2, 0] = 20.0  # head 0: query 2 selects key 1 (score ~14)
    q[:, 0, 1, 0] = 20.0  # head 0: query 1 selects itself (exempt)
    q[:, 0, 3, 1] = 20.0  # head 0: query 3 selects BOS (exempt unless exempt_bos=false)
    v = torch.eye(5).expand(1, 2, 5, 5)  # the output is the weights
    return q, k, v


def test_a_selected_token_is_masked_for_every_later_query_in_every_head():
    q, k, v = constructed()
    sel = MultiHeadAttention(4, 2, spec="selective").eval()
    plain = MultiHeadAttention(4, 2, spec="unas").eval()
    w = sel.attend_heads(q, k, v, causal=True)[0]
    w_plain = plain.attend_heads(q, k, v, causal=True)[0]
    # up to query 2 (the one that selects) nothing changes: selection only masks the future
    torch.testing.assert_close(w[:, :, :3], w_plain[:, :, :3])
    # from query 3 on, key 1 is all but gone in both heads, although head 1 favoured it
    assert (w_plain[0, 1, 3:, 1] > 0.4).all()
    assert (w[:, :, 3:, 1] < 1e-5).all()
    # query 1 selecting itself and query 3 selecting BOS mask nothing: rows 3 and 4 spread the
    # weight of key 1 over the others as a softmax without key 1 would
    rest = w_plain[0, 1, 4, [0, 2, 3, 4]]
    torch.testing.assert_close(w[0, 1, 4, [0, 2, 3, 4]], rest / rest.sum(), atol=1e-5, rtol=1e-5)
    # without the BOS exemption, query 3's selection of key 0 masks it for query 4
    no_bos = MultiHeadAttention(4, 2, spec={"scheme": "selective", "exempt_bos": False}).eval()
    w_no_bos = no_bos.attend_heads(q, k, v, causal=True)[0]
    assert (w_no_bos[:, :, 4, 0] < 1e-5).all() and (w[:, :, 4, 0] > 0.1).all()
    torch.testing.assert_close(w_no_bos[:, :, :4], w[:, :, :4])
    # another selecting head: head 1 selects key 1 mildly from query 2 on (query 1 is key 1
    # itself): at query 3 one selection has cancelled its score, at query 4 two push it down
    by_head_1 = MultiHeadAttention(4, 2, spec={"scheme": "selective", "selecting_head": 1}).eval()
    w_h1 = by_head_1.attend_heads(q, k, v, causal=True)[0]
    torch.testing.assert_close(w_h1[:, :, :3], w_plain[:, :, :3])
    torch.testing.assert_close(w_h1[0, 1, 3, :4], torch.full((4,), 0.25))
    assert (w_h1[:, :, 4, 1] < 0.1).all()


def test_refused_outside_causal_attention_in_one_line():
    assert TRANSFORMS["selective"].causal_only and AttentionSpec.from_config("selective").causal_only
    assert "selective" in fitting(causal=True) and "selective" not in fitting(causal=False)
    m = MultiHeadAttention(E, H, spec="selective")
    with pytest.raises(ConfigError, match="causal attention only") as info:
        m(torch.randn(1, 4, E))
    assert "\n" not in str(info.value) and "model=selective" not in str(info.value).split("one of")[1]
    # the runner refuses a task whose scheme-carrying attention is not causal, at once
    for causal in (False, True):
        cfg = OmegaConf.create({"model": {"name": "selective", "scheme": "selective"},
                                "task": {"name": "classify", "causal": causal}})
        if causal:
            check_scheme_fits_task(cfg)
        else:
            with pytest.raises(ConfigError, match="causal attention only"):
                check_scheme_fits_task(cfg)


def test_options_and_shapes_are_checked():
    with pytest.raises(ConfigError, match="selecting_head=-1 must be an integer >= 0"):
        AttentionSpec("selective", selecting_head=-1)
    with pytest.raises(ConfigError, match=r"selecting_head=3 must be < the number of heads \(3\)"):
        MultiHeadAttention(E, H, spec={"scheme": "selective", "selecting_head": 3})(
            torch.randn(1, 4, E), causal=True)
    m = MultiHeadAttention(E, H, spec="selective")
    assert not m.transform.row_wise and not m.transform.passes_logits and not m.can_step(True)
    # no parameters of its own
    assert {n.split(".")[0] for n, _ in m.named_parameters()} == {"q_proj", "k_proj", "v_proj", "out_proj"}
    keys, values = m.keys_values(torch.randn(1, 4, E))
    with pytest.raises(ConfigError, match="re-running the prefix"):
        m.attend_to(torch.randn(1, 1, E), keys, values, causal=True)


@torch.no_grad()
def test_lm_decoding_re_runs_the_prefix_and_equals_the_full_pass():
    from helpers.modules import task_module

    from attnlab.attention import PrefixCache
    from tasks.common.decoding import sample

    torch.manual_seed(0)
    sizes = {"d_model": 16, "nhead": 2, "num_layers": 2, "dim_feedforward": 32, "dropout": 0.0}
    model = task_module("lm", {"scheme": "selective"}, vocab_size=30, pad_id=0, eos_id=1, block_size=8,
                        adaptive_cutoffs=[5, 15], token_order=torch.randperm(30).tolist(),
                        **sizes).eval().net
    prompts = torch.randint(2, 30, (2, 5))
    cache = model.start_decoding()
    assert isinstance(cache, PrefixCache)
    full = model(prompts)
    for t in range(prompts.shape[1]):  # the newest row of a prefix is the full pass's row
        torch.testing.assert_close(model.decode_step(prompts[:, t], cache), full[:, t], atol=1e-5, rtol=1e-5)
    greedy = sample(model, prompts, max_new_tokens=3)
    sequence = prompts
    for _ in range(3):
        sequence = torch.cat([sequence, model.logits(model(sequence)[:, -1]).argmax(-1, keepdim=True)], 1)
    assert torch.equal(greedy, sequence[:, 5:])


def test_train_lm_with_selective(tmp_path, data_dir):
    run_here(["task=lm", "model=selective", "debug=fast", "callbacks=minimal", *TINY["lm"], *QUIET],
             tmp_path, data_dir)
    (record,) = metrics_files(tmp_path / "outputs")
    assert record["status"] == "ok", record.get("error")
    assert any(k.startswith("test/") for k in record["metrics"])


def test_in_transformers_models_refused_in_an_encoder_and_run_in_a_decoder():
    transformers = pytest.importorskip("transformers")
    from attnlab.hf import use_scheme

    torch.manual_seed(0)
    bert = transformers.BertModel(transformers.BertConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, vocab_size=32),
        add_pooling_layer=False).eval()
    with pytest.raises(ConfigError, match="causal attention only") as info:
        use_scheme(bert, "selective")
    assert "\n" not in str(info.value)
    gpt2 = transformers.GPT2Model(transformers.GPT2Config(
        n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=16, attn_pdrop=0.0, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_implementation="eager")).eval()
    ids = torch.randint(1, 32, (2, 6))
    plain = gpt2(input_ids=ids).last_hidden_state
    out = use_scheme(gpt2, "selective")(input_ids=ids).last_hidden_state
    assert torch.isfinite(out).all() and not torch.allclose(out, plain)
    torch.testing.assert_close(out[:, :2], plain[:, :2])  # queries 0 and 1: no earlier selection


def test_the_selection_is_built_on_the_scores_device():
    """(meta: a device other than the CPU, here without one)"""
    scores = torch.randn(2, H, S, S, device="meta")
    out = TRANSFORMS["selective"]()(scores, None)
    assert out.device.type == "meta" and out.shape == scores.shape

"""classify's model: Lin et al.'s hops through the scheme registry, the penalty, the hops as the
particles of the training rules, and a training step of the module."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from helpers.modules import task_module

from attnlab.attention import record_attention
from attnlab.callbacks import DisagreementRegularizer, RepulsiveAttention
from attnlab.callbacks.repulsive import disagreement, svgd_gradient
from tasks.classify.datamodule import collate
from tasks.classify.hops import HopAttention, lin_penalty
from tasks.classify.module import hop_diversity

# the module logs outside a Trainer here
pytestmark = pytest.mark.filterwarnings("ignore:You are trying to `self.log")

TINY = {"vocab_size": 20, "num_classes": 3, "embed_dim": 8, "hidden_dim": 6, "d_model": 8, "nhead": 2,
        "num_layers": 2, "dim_feedforward": 16, "hops": 3, "attention_unit": 5, "fc_dim": 8, "dropout": 0.0}


def states_and_mask(batch=2, n=5, dim=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    states = torch.randn(batch, n, dim, generator=g)
    mask = torch.zeros(batch, n, dtype=torch.bool)
    mask[1, 3:] = True  # the second sentence has 3 tokens
    return states, mask


def lin_by_the_formula(hops: HopAttention, states, mask):
    """A = softmax(W_s2 tanh(W_s1 H^T)) over the valid tokens and M = A H, one sentence at a time."""
    w1, w2 = hops.k_proj.weight, hops.hop_queries
    weights, outputs = [], []
    for h, pad in zip(states, mask):
        scores = (w2 @ torch.tanh(w1 @ h.T)).masked_fill(pad[None, :], float("-inf"))
        a = scores.softmax(-1)
        weights.append(a)
        outputs.append(a @ h)
    return torch.stack(weights), torch.stack(outputs)


def test_lins_penalty_equals_a_hand_computation():
    # A A^T = [[0.5, 0.125], [0.125, 0.625]]: (A A^T - I) squared sums to 0.25 + 2 * 0.015625 + 0.140625
    a = torch.tensor([[[0.5, 0.5, 0.0], [0.0, 0.25, 0.75]],
                      [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]])  # the second: orthonormal hops, P = 0
    assert float(lin_penalty(a[:, None])) == pytest.approx((0.421875 + 0.0) / 2)


def test_unas_hops_are_lins_attention():
    torch.manual_seed(0)
    hops = HopAttention(6, 3, 4, "unas")
    states, mask = states_and_mask()
    expected_a, expected_m = lin_by_the_formula(hops, states, mask)
    torch.testing.assert_close(hops.hop_weights(states, mask)[:, 0], expected_a)
    torch.testing.assert_close(hops(states, mask), expected_m)
    assert hops.q_proj is None and hops.k_proj.bias is None  # no parameters besides W_s1, W_s2


def test_dnas_normalizes_each_token_over_the_hops_first_and_keeps_the_lemma():
    torch.manual_seed(1)
    hops = HopAttention(6, 4, 4, "dnas")
    states, mask = states_and_mask()
    w1, w2 = hops.k_proj.weight, hops.hop_queries
    for b, n in ((0, 5), (1, 3)):
        scores = w2 @ torch.tanh(w1 @ states[b, :n].T)  # (r, n)
        over_hops = scores.softmax(0)  # each token's weights over the hops sum to 1
        expected = over_hops / over_hops.sum(1, keepdim=True)
        a = hops.hop_weights(states, mask)[b, 0]
        torch.testing.assert_close(a[:, :n], expected)
        assert torch.all(a[:, n:] == 0)
        # the lemma: every token gets total weight >= 1/n from the hops
        assert float(a[:, :n].sum(0).min().detach()) >= 1 / n - 1e-6
    # the fast path (fused kernel or composed) gives A H
    torch.testing.assert_close(hops(states, mask), hops.hop_weights(states, mask)[:, 0] @ states)


def test_records_hold_a_and_m_and_the_diversity_numbers():
    torch.manual_seed(2)
    hops = HopAttention(6, 3, 4, "unas")
    states, mask = states_and_mask()
    with record_attention([("hops", hops)]) as rec:
        m = hops(states, mask)
    record = rec.records["hops"]
    a = hops.hop_weights(states, mask)
    torch.testing.assert_close(record.weights, a.detach())
    torch.testing.assert_close(record.head_outputs[:, 0], m.detach())
    dist, jsd, count = hop_diversity(record.weights, record.head_outputs)
    pairwise = torch.stack([torch.pdist(m[b]).mean() for b in range(2)])  # over the r (r-1)/2 pairs
    assert count == 2 and dist == pytest.approx(float(pairwise.sum().detach()), rel=1e-5)
    assert 0 < jsd < 2 * torch.log(torch.tensor(2.0))


def test_the_hop_rows_are_the_particles_of_repulsive_attention():
    torch.manual_seed(3)
    module = task_module("classify", "unas", encoder="transformer", **TINY)
    for p in module.parameters():
        p.grad = torch.randn_like(p)
    hops = module.net.hops
    theta, grad = hops.hop_queries.detach().clone(), hops.hop_queries.grad.clone()
    key_grad = hops.k_proj.weight.grad.clone()
    rule = RepulsiveAttention(step_size=0.1, alpha=0.5)
    groups = {name: sets for name, _, sets in rule.groups(module)}
    assert groups["net.hops"] == [[hops.hop_queries]]
    assert len(groups) == 3  # the two encoder layers (per-head q/k/v rows) and the hops
    rule.apply(module)
    torch.testing.assert_close(hops.hop_queries.grad, 0.1 * svgd_gradient(theta, grad, 0.5))
    assert torch.equal(hops.k_proj.weight.grad, key_grad)  # W_s1 is shared by the hops: not a particle


def batch_of(n_examples=4, pair=False):
    g = torch.Generator().manual_seed(4)
    items = []
    for i in range(n_examples):
        item = {"input_ids": torch.randint(2, 20, (2 + i,), generator=g).tolist(), "label": i % 3}
        if pair:
            item["input_ids_b"] = torch.randint(2, 20, (5 - i % 3,), generator=g).tolist()
        items.append(item)
    return collate(items)


@pytest.mark.parametrize("pair", [False, True])
def test_training_step_adds_lins_penalty_and_mar_the_hops_disagreement(pair):
    torch.manual_seed(5)
    module = task_module("classify", "unas", penalty=0.5, pair=pair, **TINY)
    module.train()
    batch = batch_of(pair=pair)
    sentences = [("input_ids", "padding_mask", "lengths")] + ([("input_ids_b", "padding_mask_b", "lengths_b")]
                                                              if pair else [])
    states = [(module.net.encoder(*(batch[k] for k in keys)), batch[keys[1]]) for keys in sentences]
    penalty = torch.stack([lin_penalty(module.net.hops.hop_weights(s, m)) for s, m in states]).mean()
    expected = F.cross_entropy(module(batch), batch["labels"]) + 0.5 * penalty
    torch.testing.assert_close(module.training_step(batch, 0), expected)

    mar = DisagreementRegularizer(weight=0.2)
    mar.on_fit_start(SimpleNamespace(is_global_zero=True), module)
    try:
        loss = module.training_step(batch, 0)
    finally:
        mar.teardown(None, module, "fit")
    hop_disagreement = sum(disagreement(module.net.hops(s, m)) for s, m in states)
    torch.testing.assert_close(loss, expected + 0.2 * hop_disagreement)


def test_a_few_steps_fit_one_batch():
    torch.manual_seed(6)
    module = task_module("classify", "dnas", penalty=0.1, **TINY)
    batch = batch_of(6)
    optimizer = torch.optim.Adam(module.parameters(), lr=1e-2)
    first = float(F.cross_entropy(module(batch), batch["labels"]))
    for _ in range(40):
        loss = module.training_step(batch, 0)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert float(F.cross_entropy(module(batch), batch["labels"])) < 0.3 * first
    assert module(batch).argmax(-1).tolist() == batch["labels"].tolist()


def test_several_hop_heads_split_the_hops_queries_and_states():
    torch.manual_seed(7)
    hops = HopAttention(6, 3, 4, "unas", heads=2)
    states, mask = states_and_mask()
    a = hops.hop_weights(states, mask)
    assert a.shape == (2, 2, 3, 5)
    m = hops(states, mask)
    # head h attends with its half of W_s1's rows and of the hop queries over its half of the states
    for h in range(2):
        torch.testing.assert_close(m[..., 3 * h : 3 * h + 3], a[:, h] @ states[..., 3 * h : 3 * h + 3])

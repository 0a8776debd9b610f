"""Sinks and outliers (attnlab.diagnostics, the callback, `python -m attnlab.diagnose`): each
number against an independent float64 statement of its authors' definition on fixed tensors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.stats
import torch

from attnlab.attention import MultiHeadAttention, record_attention
from attnlab.diagnostics import (
    LayerOutliers,
    kurtosis_per_sequence,
    pooled_kurtosis,
    power_sums,
    sink_importance,
    summarize,
    top_and_median,
    zero_counts,
)


def causal_softmax(B, H, T, seed, sink_logit=0.0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, H, T, T, generator=g, dtype=torch.float64)
    logits[..., 0] += sink_logit
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    return logits.masked_fill(future, -torch.inf).softmax(-1)


def gu_importance(attention: np.ndarray) -> np.ndarray:
    """sail-sg/Attention-Sink compute_attention_sink, restated in NumPy for one layer:
    (A / ratios).sum over queries, ratios = T, T-1, ..., 1 along the keys -> (B, H, T)."""
    T = attention.shape[-1]
    ratios = np.arange(T, 0, -1, dtype=np.float64)[None, None, None, :]
    return (attention / ratios).sum(axis=-2)


def test_sink_importance_and_rate_are_gu_et_al_s_on_causal_rows():
    w = causal_softmax(3, 4, 12, seed=0, sink_logit=1.5)
    expected = gu_importance(w.numpy())
    for key in (0, 5, 11):
        got = sink_importance(w, causal=True, key=key)
        np.testing.assert_allclose(got.numpy(), expected[..., key], rtol=1e-12, atol=0)
    metric = LayerOutliers(key="first", epsilons=(0.3, 0.2))
    metric.update(w.float(), None, causal=True)
    out = metric.compute()
    for eps, name in ((0.3, "sink_rate"), (0.2, "sink_rate_eps0.2")):
        assert out[name] == pytest.approx(float((expected[..., 0] > eps).mean()), abs=1e-12)


def test_a_sink_logit_of_10_is_a_sink_and_0_is_none():
    """The mechanism shows: +10 on the first key's logit puts every head's mean weight there
    (rate 1); without it (logit 0) no head reaches eps 0.2 (64 keys, as Gu et al.'s prompts: a
    causal row i spreads 1 over i + 1 keys, so key 0 still averages H_64 / 64 = 0.07; at 16 keys
    it would average 0.21, above 0.2 without any sink)."""
    for logit, rate in ((10.0, 1.0), (0.0, 0.0)):
        metric = LayerOutliers()
        metric.update(causal_softmax(4, 3, 64, seed=1, sink_logit=logit).float(), None, causal=True)
        out = metric.compute()
        assert out["sink_rate"] == rate and out["sink_rate_eps0.2"] == rate


def test_a_sink_through_a_real_attention_module_and_the_last_key_of_padded_rows():
    """A MultiHeadAttention whose first key draws every query (its key vector aligned with every
    query, scaled): recorded weights give rate 1 at key "first"; with padding, key "last" is each
    row's last real key (BERT's [SEP]), not a padded one."""
    torch.manual_seed(0)
    m = MultiHeadAttention(8, 2, spec="unas").eval()
    with torch.no_grad():
        m.q_proj.weight.zero_()
        m.q_proj.bias.fill_(1.0)
        m.k_proj.weight.zero_()
        m.k_proj.bias.zero_()
    x = torch.randn(2, 6, 8)
    x[..., 0] = 0.0
    x[:, 0, 0] = 1.0  # feature 0: the first token's alone
    with torch.no_grad():
        m.k_proj.weight[:, 0] = 40.0  # only the first token has x[..., 0] = 1: key 0's logit is +40
    padding = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])
    with torch.no_grad(), record_attention(m) as rec:
        m(x, key_padding_mask=padding, query_padding_mask=padding)
    (record,) = rec.records.values()
    first = LayerOutliers(key="first")
    first.update(record.weights, None, padding, padding, record.causal)
    assert first.compute()["sink_rate"] == 1.0
    last = sink_importance(record.weights, padding, padding, False, key="last")
    np.testing.assert_allclose(last[1].numpy(), record.weights[1, :, :4, 3].double().mean(-1).numpy(),
                               rtol=1e-6)


def masked_hidden(seed=3):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(3, 6, 5, generator=g, dtype=torch.float64)  # even counts: 30, 30, 20 values
    h[1, 2, 4] = 60.0  # a massive activation
    h[2, 4:] = 1e6  # padded positions: must not count
    padding = torch.zeros(3, 6, dtype=torch.bool)
    padding[2, 4:] = True
    return h, padding


def test_kurtosis_is_bondarenko_s_per_sequence_and_pooled_is_the_fourth_standardized_moment():
    h, padding = masked_hidden()
    got = kurtosis_per_sequence(h, padding)
    for b in range(3):
        x = h[b][~padding[b]].numpy().ravel()
        mu4 = np.mean((x - x.mean()) ** 4)
        expected = mu4 / (np.std(x, ddof=1) ** 4 + 1e-6)  # outlier-free-transformers utils.kurtosis
        assert float(got[b]) == pytest.approx(expected, rel=1e-12)
    assert float(got[1]) > 10  # the outlier shows
    sums = power_sums(h[:2], padding[:2]) + power_sums(h[2:], padding[2:])  # over two batches
    values = np.concatenate([h[b][~padding[b]].numpy().ravel() for b in range(3)])
    assert pooled_kurtosis(sums) == pytest.approx(scipy.stats.kurtosis(values, fisher=False, bias=True),
                                                  rel=1e-9)


def test_top_activation_and_median_are_sun_et_al_s():
    h, padding = masked_hidden()
    top, median = top_and_median(h, padding)
    for b in range(3):
        x = np.sort(np.abs(h[b][~padding[b]].numpy().ravel()))
        assert float(top[b]) == x[-1]
        assert float(median[b]) == x[(len(x) - 1) // 2]  # torch.median: the lower middle value
    assert float(top[1]) == 60.0 and float(top[2]) < 1e6


def test_zero_share_counts_exact_zeros_where_a_query_may_attend():
    w = torch.tensor([[[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.5, 0.0, 0.5]]]])
    assert zero_counts(w, causal=True) == (1 + 1, 6)  # the future is not counted
    assert zero_counts(w, causal=False) == (5, 9)
    padding = torch.tensor([[False, False, True]])
    assert zero_counts(w, padding, padding, causal=False) == (2, 4)


def test_layer_outliers_reduce_over_batches_and_processes_and_summarize():
    w = causal_softmax(4, 2, 8, seed=2, sink_logit=2.0).float()
    h = torch.randn(4, 8, 5, generator=torch.Generator().manual_seed(4))
    one = LayerOutliers()
    one.update(w, h, causal=True)
    parts = [LayerOutliers(), LayerOutliers()]  # two DDP processes, two examples each
    for part, rows in zip(parts, (slice(0, 2), slice(2, 4))):
        part.update(w[rows], h[rows], causal=True)
    parts[0].merge_state(parts[1])
    a, b = one.compute(), parts[0].compute()
    assert a.keys() == b.keys() and all(a[k] == pytest.approx(b[k], rel=1e-6) for k in a)
    model = summarize({0: {"kurtosis": 3.0, "largest_abs": 5.0}, 1: {"kurtosis": 9.0, "largest_abs": 2.0}})
    assert model == {"kurtosis": 6.0, "max_kurtosis": 9.0, "largest_abs": 5.0}


def test_diagnose_the_packaged_minilm_finds_its_cls_sink(tmp_path, capsys):
    """`python -m attnlab.diagnose <MiniLM dir>` (in this process): a JSON and a PNG, the table,
    and the pretrained BERT's sink on [CLS] in its middle layers (Gu et al.'s premise holds)."""
    pytest.importorskip("transformers")
    from attnlab.diagnose import main
    from tasks.common.bert_assets import bert_dir

    assert main([str(bert_dir()), "--out", str(tmp_path), "--batches", "2"]) == 0
    results = json.loads((tmp_path / "diagnostics.json").read_text())
    assert (tmp_path / "diagnostics.png").stat().st_size > 1000
    assert results["causal"] is False and len(results["layers"]) == 6
    rates = [results["layers"][str(l)]["sink_rate"] for l in range(6)]
    assert max(rates[1:5]) > 0.5 and rates[0] < 0.1
    assert all(layer["zero_share"] == 0 for layer in results["layers"].values())  # softmax
    out = capsys.readouterr().out
    assert "sink rate" in out and "kurtosis" in out and str(tmp_path / "diagnostics.json") in out


def test_diagnose_refuses_what_is_not_a_model_in_one_line(tmp_path, capsys):
    from attnlab.diagnose import main

    assert main([str(tmp_path / "nope.ckpt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "neither a checkpoint file nor a transformers model directory" in err[0]


def test_a_bad_sink_key_or_threshold_is_one_clear_error():
    from attnlab.diagnostics import check_options, sink_key_index
    from attnlab.errors import ConfigError

    with pytest.raises(ConfigError, match="the sink key is first, last or an index"):
        check_options("middle", (0.3,))
    with pytest.raises(ConfigError, match=r"each sink threshold must lie in \(0, 1\)"):
        LayerOutliers(epsilons=(1.5,))
    with pytest.raises(ConfigError, match=r"key=99 is outside the 64 keys"):
        sink_key_index(None, 2, 64, 99)
    assert sink_key_index(None, 2, 64, -1).tolist() == [63, 63]

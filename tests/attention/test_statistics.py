"""Column statistics (attnlab.attention.statistics): the one place for explaining-away numbers."""

import math

import pytest
import torch

from attnlab.attention import ColumnStats, attention_weights, column_sums


def random_masks(B, S, p, generator):
    mask = torch.rand(B, S, generator=generator) < p
    mask[:, 0] = False  # at least one valid position per example
    return mask


def test_column_stats_against_hand_computed_values_across_processes():
    # two examples, one head, three keys; the second example's last key is padding
    sums = torch.tensor([[[0.5, 1e-9, 2.5]], [[1.0, 2.0, 99.0]]])
    padding = torch.tensor([[False, False, False], [False, False, True]])
    kinds = torch.tensor([[0, 2, 1], [2, 1, -1]])  # background / visible / hidden, -1 padding
    stats = ColumnStats(["background", "visible", "hidden"], threshold=1e-8)
    stats.update(sums[:1], padding[:1], kind=kinds[:1])
    other = ColumnStats(["background", "visible", "hidden"], threshold=1e-8)  # a 2nd DDP process
    other.update(sums[1:], padding[1:], kind=kinds[1:])
    stats.merge_state(other)
    out = stats.compute()
    assert out["explained_away"].item() == pytest.approx(1 / 5)  # 1e-9 of 5 valid keys
    # min of col_sum * S: S = 3 valid keys in the first example, 2 in the second
    assert out["min_col_sum_x_S"].item() == pytest.approx(3e-9)
    assert out["min_col_sum"].item() == pytest.approx(1e-9) and out["bound_1_over_S"].item() == pytest.approx(1 / 3)
    assert out["explained_away_hidden"].item() == pytest.approx(1 / 2)
    assert out["col_sum_hidden"].item() == pytest.approx((1e-9 + 1.0) / 2)
    assert out["col_sum_visible"].item() == pytest.approx((2.5 + 2.0) / 2)
    assert out["col_sum_background"].item() == pytest.approx(0.5)
    assert out["explained_away_background"].item() == 0
    expected = torch.tensor([0.5, 1e-9, 2.5, 1.0, 2.0]).log()
    torch.testing.assert_close(stats.log_column_sums().sort().values, expected.sort().values)
    empty = ColumnStats(["hidden"]).compute()
    assert all(math.isnan(v.item()) for v in empty.values())


def test_dnas_lemma_and_unas_explaining_away():
    g = torch.Generator().manual_seed(0)
    B, H, S = 3, 2, 12
    q = torch.randn(B, H, S, 8, generator=g) * 3
    k = torch.randn(B, H, S, 8, generator=g) * 3
    kpm, qpm = random_masks(B, S, 0.3, g), random_masks(B, S, 0.3, g)
    w = attention_weights(q, k, scheme="dnas", key_padding_mask=kpm, query_padding_mask=qpm)
    cols = column_sums(w, qpm)
    torch.testing.assert_close(cols, w.masked_fill(qpm[:, None, :, None], 0).sum(2))
    stats = ColumnStats()
    stats.update(cols, kpm, qpm)
    out = stats.compute()
    # lemma: every valid key gets at least 1/S_valid of the total weight
    assert out["min_col_sum_x_S"] >= 1 - 1e-5 and out["explained_away"] == 0
    assert out["min_col_sum"] == pytest.approx(float(cols[(~kpm)[:, None].expand(B, H, S)].min()), rel=1e-5)

    # UNAS with one key that every query ignores: it is explained away (column sum ~ 0)
    q2, k2 = q.clone(), k.clone()
    q2[..., 0] = 5.0
    k2[:, :, -1] = 0.0
    k2[:, :, -1, 0] = -40.0  # score -40*5/sqrt(8) ~ -71 for every query
    unas = ColumnStats()
    unas.update(column_sums(attention_weights(q2, k2, scheme="unas")))
    out = unas.compute()
    assert out["min_col_sum"] < 1e-8 and out["min_col_sum_x_S"] < 1 and out["explained_away"] > 0


def test_examples_without_a_valid_query_are_left_out():
    sums = torch.zeros(2, 1, 3)
    qpm = torch.tensor([[True, True], [False, True]])  # example 0 has no valid query
    sums[1] = 1.0
    stats = ColumnStats()
    stats.update(sums, None, qpm)
    assert stats.compute()["explained_away"] == 0  # the zeros of example 0 do not count

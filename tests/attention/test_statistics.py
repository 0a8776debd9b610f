"""Column statistics (attnlab.attention.statistics): the one place for explaining-away numbers."""

import math

import pytest
import torch

from attnlab.attention import ColumnStats, attention_weights, column_sums
from attnlab.attention.schemes import NORMALIZERS


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


# ----------------------------------------------------------------------------- rows that need not sum to 1
def test_entropy_and_unassigned_mass_of_sub_stochastic_rows_against_hand_computed_values():
    from attnlab.attention.statistics import (
        RowStats,
        attention_entropy,
        row_distributions,
        unassigned_mass,
        valid_rows,
    )

    # one head, four queries over three keys; the last query is padding
    w = torch.tensor([[[[0.5, 0.25, 0.0],     # mass 3/4: distribution (2/3, 1/3, 0), sink 1/4
                        [0.0, 0.0, 0.0],      # a valid query attending nowhere: sink 1, entropy 0
                        [0.2, 0.2, 0.2],      # mass 0.6: uniform, entropy log 3, sink 0.4
                        [0.0, 0.0, 0.0]]]])   # padding: left out
    qpm = torch.tensor([[False, False, False, True]])
    rows = valid_rows(w, qpm, qpm)
    assert rows.tolist() == [[True, True, True, False]]
    h0 = math.log(3) - 2 / 3 * math.log(2)
    entropy = attention_entropy(w, rows)[:, 0]
    torch.testing.assert_close(entropy, torch.tensor([h0, 0.0, math.log(3)], dtype=torch.float64))
    torch.testing.assert_close(unassigned_mass(w, rows)[:, 0], torch.tensor([0.25, 1.0, 0.4], dtype=torch.float64))
    p = row_distributions(w)
    assert not p.isnan().any() and torch.allclose(p.sum(-1), torch.ones(1, 1, 4, dtype=torch.float64))
    assert p[0, 0, 1].tolist() == [0, 0, 0, 1]  # no mass: the point mass on "nowhere"
    stats, other = RowStats(), RowStats()  # a second DDP process holds the second half
    stats.update(w[..., :2, :], qpm[:, :2], qpm[:, :2])
    other.update(w[..., 2:, :], qpm[:, 2:], qpm[:, 2:])
    stats.merge_state(other)
    out = stats.compute()
    assert out["entropy"].item() == pytest.approx((h0 + 0 + math.log(3)) / 3)
    assert out["unassigned_mass"].item() == pytest.approx((0.25 + 1 + 0.4) / 3)
    assert sorted(stats.unassigned_masses().tolist()) == pytest.approx([0.25, 0.4, 1.0])
    assert all(math.isnan(v) for v in RowStats().compute().values())


def test_jsd_of_sub_stochastic_rows_compares_their_distributions():
    from attnlab.attention.statistics import jsd_matrix

    w = torch.zeros(1, 3, 2, 3)
    w[0, 0, 0] = torch.tensor([0.5, 0.25, 0.0])
    w[0, 1, 0] = torch.tensor([0.2, 0.1, 0.0])   # the same distribution with less mass: JSD 0
    w[0, 2, 0] = 0.0                              # nowhere: log 2 against both
    rows = torch.tensor([[True, True]])  # row 1: every head attends nowhere (JSD 0 between them)
    matrix, n = jsd_matrix(w, rows)
    assert n == 2 and not matrix.isnan().any()
    assert matrix[0, 1].item() == pytest.approx(0.0, abs=1e-12)
    assert matrix[0, 2].item() == pytest.approx(math.log(2)) and matrix[1, 2].item() == pytest.approx(math.log(2))


def _weights_of(name, q, k, kpm, qpm):
    from attnlab.attention import AttentionSpec

    normalizer = AttentionSpec.from_config(name).build_normalizer(q.shape[1])
    return normalizer.attention_weights(q, k, kpm, qpm, causal=normalizer.causal_only).detach()


@pytest.mark.parametrize("name", sorted(NORMALIZERS))
def test_unassigned_mass_is_zero_for_normalizing_schemes_and_one_minus_the_row_sum_otherwise(name):
    from attnlab.attention.statistics import (
        RowStats,
        attention_entropy,
        unassigned_mass,
        valid_rows,
    )

    g = torch.Generator().manual_seed(0)
    B, H, S = 2, 2, 6
    q, k = torch.randn(B, H, S, 4, generator=g), torch.randn(B, H, S, 4, generator=g)
    pad = torch.zeros(B, S, dtype=torch.bool)
    pad[1, 4:] = True
    w = _weights_of(name, q, k, pad, pad)
    rows = valid_rows(w, pad, pad)
    sinks = unassigned_mass(w, rows)
    assert sinks.shape == (6 + 4, H)  # the second example's two padded queries left out
    if NORMALIZERS[name].rows_sum_to_one:
        assert sinks.abs().max() < 1e-5, name
    else:
        torch.testing.assert_close(sinks, 1 - w.double().sum(-1).transpose(1, 2)[rows])
    entropy = attention_entropy(w, rows)
    assert torch.isfinite(entropy).all() and (entropy >= -1e-9).all()
    assert (entropy <= math.log(S) + 1e-6).all()
    stats = RowStats()
    stats.update(w, pad, pad)
    assert stats.compute()["unassigned_mass"].item() == pytest.approx(float(sinks.mean()), abs=1e-6)


def test_a_sink_scheme_s_unassigned_mass_is_the_sink_s_share():
    """A throwaway softmax with one extra logit b per head (the sink): the unassigned mass is
    exp(b) / (exp(b) + sum_j exp(s_ij)), the weight the sink took."""
    from attnlab.attention.schemes import Normalizer, register, unregister
    from attnlab.attention.statistics import unassigned_mass, valid_rows

    @register
    class ZeroSink(Normalizer):
        name = "zero_sink_test"
        rows_sum_to_one = False

        def weights(self, logits, **inputs):
            sink = torch.zeros_like(logits[..., :1])
            return torch.softmax(torch.cat([logits, sink], -1), -1)[..., :-1]

    try:
        g = torch.Generator().manual_seed(1)
        q, k = torch.randn(1, 2, 5, 4, generator=g), torch.randn(1, 2, 5, 4, generator=g)
        w = _weights_of("zero_sink_test", q, k, None, None)
        s = q @ k.transpose(-1, -2) / 2.0  # scores scaled by 1/sqrt(d)
        expected = 1 / (1 + s.double().exp().sum(-1))  # exp(0) / (exp(0) + sum exp s)
        torch.testing.assert_close(unassigned_mass(w, valid_rows(w)), expected.transpose(1, 2)[0], rtol=1e-5, atol=1e-6)
    finally:
        unregister("zero_sink_test")

"""Column statistics of attention weights: how much total weight each key receives.

The one place for the "explaining away" numbers (the seed paper's epsilon-explained-away and the
DNAS lemma): `column_sums` computes `c_j = sum_i w_ij` over valid queries, and `ColumnStats`
aggregates them over batches (a torchmetrics Metric, so sums, minima and histograms are reduced
across DDP processes). The ExplainedAway callback and the VQA task both use it.

Also the head-diversity numbers, the one place for them: `jsd_matrix` (Jensen-Shannon divergence
between the heads' attention distributions, per valid query row) and `head_distance_sum` (mean
pairwise L2 distance between the heads' outputs), used by the HeadDiversity callback and the
classify task's hop diversity.

And the one definition of a row's distribution for schemes whose rows need not sum to 1
(`Normalizer.rows_sum_to_one` False: sigmoid, sink, softpick, stick-breaking). A valid query row i
has mass `m_i = sum_j w_ij`; its **unassigned mass** is `1 - m_i` (`unassigned_mass`: 0 under a normalizing
scheme, the weight a sink absorbed, negative where sigmoid's row exceeds 1). Its **distribution**
(`row_distributions`), on which entropy and JSD are computed, is the row renormalized over its
mass, `w_ij / m_i` (signed weights, differential attention's, by their positive part), and
where `m_i = 0` the point mass on one extra outcome, "nowhere" (entropy 0,
JSD log 2 against any row that attends somewhere, 0 against another such row). Entropy and JSD thus
measure where a row's attention goes, comparably across schemes (log S: uniform, 0: one key), and
the unassigned mass, reported beside them, how much of it there is. Column sums stay those of the
weights as applied (what the next layer receives): a key with `c_j < 1e-8` is unused whatever the
reason, and the unassigned mass tells whether the weight went to other keys (explaining away) or
nowhere (a sink). `valid_rows` decides the rows from the padding masks, never from the row sums.
(Named `sink_mass` before: the attention-sink papers' sink rate is another number, the weight
heads put on one key, `attnlab.diagnostics`; attnlab.reproduce still reads an older run's key.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor
from torchmetrics import Metric

LOG_FLOOR = 1e-30  # the log of an exactly-zero column sum is shown at log(1e-30)


def column_sums(weights: Tensor, query_padding_mask: Tensor | None = None) -> Tensor:
    """(B, H, S_k): total weight each key receives from the valid queries of (B, H, S_q, S_k)."""
    w = weights.float()
    if query_padding_mask is not None:
        w = w.masked_fill(query_padding_mask[:, None, :, None], 0.0)
    return w.sum(dim=-2)


def valid_keys(shape: torch.Size, key_padding_mask: Tensor | None,
               query_padding_mask: Tensor | None, device) -> Tensor:
    """(B, H, S_k) bool: keys that count (not padded, in an example with at least one valid query)."""
    B, H, S_k = shape
    valid = torch.ones(B, S_k, dtype=torch.bool, device=device)
    if key_padding_mask is not None:
        valid = ~key_padding_mask
    if query_padding_mask is not None:  # an example without any valid query attends nowhere
        valid = valid & (~query_padding_mask).any(-1, keepdim=True)
    return valid[:, None, :].expand(B, H, S_k)


class ColumnStats(Metric):
    """Column sums over batches, for valid keys only.

    compute() -> dict of (float32 scalars; NaN when nothing was counted):
      `explained_away`    share of keys with c_j < threshold (epsilon-explained-away);
      `min_col_sum`       the smallest c_j, and `bound_1_over_S` = 1/S of its example
                          (S = the example's number of valid keys: the DNAS lemma's bound);
      `min_col_sum_x_S`   min over keys of c_j * S (>= 1 under the DNAS lemma);
      with `kinds` (key categories, indexed per key in `update`): `explained_away_<kind>` and
      `col_sum_<kind>` (mean c_j) per category.
    `log_column_sums()` gives every log c_j seen (for histograms), gathered across processes.
    """

    full_state_update = False

    def __init__(self, kinds: Sequence[str] = (), threshold: float = 1e-8, **kwargs) -> None:
        super().__init__(**kwargs)
        self.kinds = list(kinds)
        self.threshold = float(threshold)
        f64 = torch.float64
        for name in ("valid", "below"):
            self.add_state(name, default=torch.tensor(0.0, dtype=f64), dist_reduce_fx="sum")
        for name in ("kind_count", "kind_below", "kind_sum"):
            self.add_state(name, default=torch.zeros(max(len(self.kinds), 1), dtype=f64),
                           dist_reduce_fx="sum")
        self.add_state("min_x_s", default=torch.tensor(math.inf, dtype=f64), dist_reduce_fx="min")
        # (min c_j, S of its example) per update: the overall minimum and its bound are picked
        # at compute time, after gathering
        self.add_state("minima", default=[], dist_reduce_fx="cat")
        self.add_state("log_col", default=[], dist_reduce_fx="cat")

    def update(self, column_sums: Tensor, key_padding_mask: Tensor | None = None,
               query_padding_mask: Tensor | None = None, kind: Tensor | None = None) -> None:
        """column_sums (B, H, S_k) from `column_sums()`; masks (B, S) True = padding; kind (B, S_k)
        index into `kinds` (negative: no category)."""
        col = column_sums.double()
        valid = valid_keys(col.shape, key_padding_mask, query_padding_mask, col.device)
        if not valid.any():
            return
        n_valid = valid[:, 0].sum(-1).clamp(min=1).double()  # (B,)
        below = col < self.threshold
        vals = col[valid]
        self.valid += valid.sum()
        self.below += (below & valid).sum()
        self.min_x_s = torch.minimum(self.min_x_s, (col * n_valid[:, None, None])[valid].min())
        at = torch.nonzero(valid)[vals.argmin()]
        self.minima.append(torch.stack([vals.min(), n_valid[at[0]]])[None])
        self.log_col.append(vals.clamp(min=LOG_FLOOR).log().float())
        if kind is not None and self.kinds:
            kind = kind[:, None, :].expand_as(col).long()
            keep = valid & (kind >= 0)
            index = kind[keep]
            self.kind_count.index_add_(0, index, torch.ones_like(index, dtype=torch.float64))
            self.kind_below.index_add_(0, index, below[keep].double())
            self.kind_sum.index_add_(0, index, col[keep])

    def compute(self) -> dict[str, Tensor]:
        nan = torch.tensor(math.nan, dtype=torch.float64, device=self.valid.device)
        out = {"explained_away": self.below / self.valid if self.valid > 0 else nan,
               "min_col_sum_x_S": self.min_x_s if torch.isfinite(self.min_x_s) else nan,
               "min_col_sum": nan, "bound_1_over_S": nan}
        minima = concatenated(self.minima)
        if minima.numel():
            low = minima[minima[:, 0].argmin()]
            out["min_col_sum"], out["bound_1_over_S"] = low[0], 1.0 / low[1]
        for i, kind in enumerate(self.kinds):
            count = self.kind_count[i]
            out[f"explained_away_{kind}"] = self.kind_below[i] / count if count > 0 else nan
            out[f"col_sum_{kind}"] = self.kind_sum[i] / count if count > 0 else nan
        return {k: torch.as_tensor(v).float() for k, v in out.items()}

    def log_column_sums(self) -> Tensor:
        return concatenated(self.log_col).flatten().cpu()


def concatenated(state) -> Tensor:
    """A list state of a torchmetrics Metric as one tensor (after a DDP sync: already one)."""
    if isinstance(state, Tensor):  # already concatenated by a DDP sync
        return state
    return torch.cat(state) if state else torch.empty(0)


# ----------------------------------------------------------------------------- rows
def visible_pairs(shape: torch.Size, key_padding_mask: Tensor | None,
                  query_padding_mask: Tensor | None, causal: bool, device) -> Tensor:
    """(B, S_q, S_k) bool: the (query, key) pairs a valid query may attend to, for weights or
    logits of `shape` (B, H, S_q, S_k); the one statement of it (diagnostics, the max logit)."""
    B, _, S_q, S_k = shape
    keys = torch.ones(B, S_k, dtype=torch.bool, device=device)
    queries = torch.ones(B, S_q, dtype=torch.bool, device=device)
    if key_padding_mask is not None:
        keys = ~key_padding_mask
    if query_padding_mask is not None:
        queries = ~query_padding_mask
    pairs = queries[:, :, None] & keys[:, None, :]
    if causal:  # query i sees keys j <= i + (S_k - S_q) (a cache's keys come first)
        pairs = pairs & torch.ones(S_q, S_k, dtype=torch.bool, device=device).tril(S_k - S_q)
    return pairs


def valid_rows(weights: Tensor, key_padding_mask: Tensor | None = None,
               query_padding_mask: Tensor | None = None) -> Tensor:
    """(B, S_q) bool: the query rows the analyses count. With masks: the queries that are not
    padding, in examples with at least one valid key (never decided by the row sums, which need
    not be 1). Without any mask: the rows where some head gives some weight (padded queries have
    all-zero rows; a valid query whose row is all zero, possible under softpick or sigmoid, is
    then dropped too, so pass the masks where there are any)."""
    B, _, S_q, _ = weights.shape
    if key_padding_mask is None and query_padding_mask is None:
        return (weights != 0).any(-1).any(1)
    rows = torch.ones(B, S_q, dtype=torch.bool, device=weights.device)
    if query_padding_mask is not None:
        rows = ~query_padding_mask
    if key_padding_mask is not None:
        rows = rows & (~key_padding_mask).any(-1, keepdim=True)
    return rows


def row_distributions(weights: Tensor) -> Tensor:
    """(..., S_k + 1) float64: each row of weights (..., S_k) as a distribution over the keys and
    "nowhere" (the last outcome): `w / sum(w)` where the row has mass, the point mass on nowhere
    where it has none (the module docstring's definition). Sums to 1; never NaN. Signed weights
    (differential attention's A = A1 - lambda A2) count by their positive part: where the row's
    attention goes; the cancelled mass shows in the unassigned mass, 1 - sum_j w_ij."""
    w = weights.double().clamp(min=0)  # a no-op for every non-negative scheme
    mass = w.sum(-1, keepdim=True)
    empty = mass <= 0
    p = torch.where(empty, torch.zeros_like(w), w / torch.where(empty, torch.ones_like(mass), mass))
    return torch.cat([p, empty.double()], dim=-1)


def _per_row(values: Tensor, rows: Tensor) -> Tensor:
    """(B, H, S_q) -> (N, H) at the valid rows."""
    return values.transpose(1, 2)[rows]


def attention_entropy(weights: Tensor, rows: Tensor | None = None) -> Tensor:
    """(N, H) entropy in nats of every valid row's distribution (`row_distributions`: the row
    renormalized over its mass; 0 for a row with no mass). weights (B, H, S_q, S_k)."""
    if rows is None:
        rows = valid_rows(weights)
    return _per_row(torch.special.entr(row_distributions(weights)).sum(-1), rows)


def unassigned_mass(weights: Tensor, rows: Tensor | None = None) -> Tensor:
    """(N, H) float64: `1 - sum_j w_ij` of every valid row (0 under a normalizing scheme)."""
    if rows is None:
        rows = valid_rows(weights)
    return _per_row(1.0 - weights.double().sum(-1), rows)


class RowStats(Metric):
    """Entropy and unassigned mass of the valid rows over batches (a torchmetrics Metric, reduced
    across DDP processes). compute() -> {"entropy": mean nats, "unassigned_mass": mean 1 - row sum}
    over heads and valid rows (NaN when nothing was counted); `unassigned_masses()` every row's unassigned
    mass seen (for histograms)."""

    full_state_update = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        for name in ("count", "entropy_sum", "unassigned_sum"):
            self.add_state(name, default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("sinks", default=[], dist_reduce_fx="cat")

    def update(self, weights: Tensor, key_padding_mask: Tensor | None = None,
               query_padding_mask: Tensor | None = None) -> None:
        rows = valid_rows(weights, key_padding_mask, query_padding_mask)
        if not rows.any():
            return
        sinks = unassigned_mass(weights, rows)
        self.count += sinks.numel()
        self.entropy_sum += attention_entropy(weights, rows).sum()
        self.unassigned_sum += sinks.sum()
        self.sinks.append(sinks.flatten().float())

    def compute(self) -> dict[str, Tensor]:
        if self.count == 0:
            nan = torch.tensor(math.nan)
            return {"entropy": nan, "unassigned_mass": nan}
        return {"entropy": (self.entropy_sum / self.count).float(),
                "unassigned_mass": (self.unassigned_sum / self.count).float()}

    def unassigned_masses(self) -> Tensor:
        return concatenated(self.sinks).flatten().cpu()


# ----------------------------------------------------------------------------- head diversity
def jsd_matrix(weights: Tensor, rows: Tensor | None = None) -> tuple[Tensor, int]:
    """Sum over valid rows of JSD(head i, head j) as an (H, H) matrix, and the number of rows.

    weights (B, H, S_q, S_k); each row is compared as its distribution (`row_distributions`:
    renormalized over its mass, "nowhere" where it has none), so rows need not sum to 1."""
    if rows is None:
        rows = valid_rows(weights)
    p = row_distributions(weights).permute(0, 2, 1, 3)[rows]  # (N, H, S_k + 1)
    n, h = p.shape[0], p.shape[1]
    out = torch.zeros(h, h, dtype=torch.float64)
    ent = torch.xlogy(p, p).sum(-1)  # (N, H): sum p log p
    for i in range(h):
        for j in range(i + 1, h):
            m = 0.5 * (p[:, i] + p[:, j])
            jsd = 0.5 * (ent[:, i] - torch.xlogy(p[:, i], m).sum(-1)) + 0.5 * (
                ent[:, j] - torch.xlogy(p[:, j], m).sum(-1)
            )
            out[i, j] = out[j, i] = jsd.clamp(min=0).sum()
    return out, n


def head_distance_sum(head_outputs: Tensor, rows: Tensor) -> tuple[float, int]:
    """Sum over valid queries of the mean pairwise L2 distance between head outputs, and the count.
    head_outputs (B, H, S_q, d_v)."""
    o = head_outputs.double().permute(0, 2, 1, 3)[rows]  # (N, H, d)
    h = o.shape[1]
    if o.shape[0] == 0:
        return 0.0, 0
    dist = torch.cdist(o, o)  # (N, H, H)
    mean_pair = dist.sum((-1, -2)) / (h * (h - 1))
    return float(mean_pair.sum()), int(o.shape[0])

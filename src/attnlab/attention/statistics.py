"""Column statistics of attention weights: how much total weight each key receives.

The one place for the "explaining away" numbers (the seed paper's epsilon-explained-away and the
DNAS lemma): `column_sums` computes `c_j = sum_i w_ij` over valid queries, and `ColumnStats`
aggregates them over batches (a torchmetrics Metric, so sums, minima and histograms are reduced
across DDP processes). The ExplainedAway callback and the VQA task both use it.

Also the head-diversity numbers, the one place for them: `jsd_matrix` (Jensen-Shannon divergence
between the heads' attention distributions, per valid query row) and `head_distance_sum` (mean
pairwise L2 distance between the heads' outputs), used by the HeadDiversity callback and the
classify task's hop diversity.
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
        minima = _cat(self.minima)
        if minima.numel():
            low = minima[minima[:, 0].argmin()]
            out["min_col_sum"], out["bound_1_over_S"] = low[0], 1.0 / low[1]
        for i, kind in enumerate(self.kinds):
            count = self.kind_count[i]
            out[f"explained_away_{kind}"] = self.kind_below[i] / count if count > 0 else nan
            out[f"col_sum_{kind}"] = self.kind_sum[i] / count if count > 0 else nan
        return {k: torch.as_tensor(v).float() for k, v in out.items()}

    def log_column_sums(self) -> Tensor:
        return _cat(self.log_col).flatten().cpu()


def _cat(state) -> Tensor:
    if isinstance(state, Tensor):  # already concatenated by a DDP sync
        return state
    return torch.cat(state) if state else torch.empty(0)


# ----------------------------------------------------------------------------- head diversity
def valid_rows(weights: Tensor) -> Tensor:
    """(B, S_q) bool: query rows that attend somewhere (padded queries have all-zero rows)."""
    return weights[:, 0].sum(-1) > 0.5


def jsd_matrix(weights: Tensor, rows: Tensor | None = None) -> tuple[Tensor, int]:
    """Sum over valid rows of JSD(head i, head j) as an (H, H) matrix, and the number of rows.

    weights (B, H, S_q, S_k) with rows summing to 1 (or 0 where nothing is attended)."""
    w = weights.double()
    if rows is None:
        rows = valid_rows(w)
    p = w.permute(0, 2, 1, 3)[rows]  # (N, H, S_k)
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

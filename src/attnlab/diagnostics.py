"""Attention sinks and activation outliers: the numbers of the sink, softpick, gated-attention and
quantization papers' first tables, the one place for their definitions.

Per layer, from its attention weights w (B, H, S_q, S_k) and its hidden state h (B, S, E) (the
output of the transformer layer that holds the attention; attnlab.callbacks.diagnostics):

- **sink rate** (Gu et al., ICLR 2025, "When attention sink emerges"; sail-sg/Attention-Sink
  `eval_sink_open_source.py: compute_attention_sink`): a key's importance in one head of one
  sequence is its mean weight over the queries that can attend to it, `sum_i w_ik / n_k` (their
  code: divide by `T - k`, the queries at or after k in a causal model); the sink rate is the share
  of (sequence, head) pairs whose importance of the sink key (the first by default; BERT's [SEP]:
  `key="last"`, the last valid key of each row) exceeds eps (0.3 by default; 0.2 also reported).
  Here: only valid queries count, and in attention that is not causal every valid query sees
  every key (`n_k` = the valid queries); their prompts are unpadded and causal. Weights as applied:
  a row that leaves mass unassigned (sink, softpick, sigmoid) gives the key only what it gives it.
- **kurtosis** (Bondarenko et al., NeurIPS 2023, "Quantizable Transformers";
  Qualcomm-AI-research/outlier-free-transformers `transformers_language/utils.py: kurtosis`): per
  sequence, its hidden state's values (valid positions x features, flattened) give
  `mu4 / (s^4 + 1e-6)` with `s` the unbiased standard deviation (torch.std's default); averaged
  over sequences, then over layers ("avg kurtosis") and its maximum over layers. Not excess
  kurtosis: a Gaussian gives 3. Also the **pooled** kurtosis, `m4 / m2^2` of every valid value of
  the layer over all the sequences (one distribution; the softpick analyses' pooled fourth moment,
  whose scripts are not in the public snapshot we read: our own statement of it).
- **largest |activation|** (Bondarenko's per-sequence inf norm, averaged over sequences) and the
  **top-1 and median** |activation| (Sun et al., COLM 2024, "Massive activations";
  locuslab/massive-activations `main_llm.py` exp2: per sequence the largest |h| and
  `torch.median(|h|)`, averaged over sequences), with their ratio: a massive activation is one
  ~1000x the median.
- **zero share** (softpick): the share of exactly-zero weights among the (query, key) pairs a
  query may attend to (valid; in causal attention, not the future): a softmax gives none.

Every function is stated once, on one batch; `LayerOutliers` sums them over batches (a torchmetrics
Metric: reduced across DDP processes). Float64 inside.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torchmetrics import Metric

from attnlab.attention.statistics import concatenated, visible_pairs
from attnlab.errors import ConfigError

EPSILONS = (0.3, 0.2)  # Gu et al.'s threshold, and the lower one they also report
KURTOSIS_EPS = 1e-6  # Bondarenko's: added to s^4


# ----------------------------------------------------------------------------- attention
def sink_key_index(key_padding_mask: Tensor | None, batch: int, length: int, key) -> Tensor:
    """(B,) the sink key of each row: an index (negative: from the end), or "last": the last
    valid key (BERT's [SEP]), or "first"."""
    if key in (None, "first"):
        key = 0
    if key == "last":
        if key_padding_mask is None:
            return torch.full((batch,), length - 1, dtype=torch.long)
        valid = (~key_padding_mask).long().cpu()
        return (valid * torch.arange(length)).argmax(-1)
    index = int(key)
    if not -length <= index < length:
        raise ConfigError(f"key={key} is outside the {length} keys of these sequences; use first, "
                          f"last or an index in [-{length}, {length})")
    return torch.full((batch,), index % length, dtype=torch.long)


def check_options(key, epsilons) -> None:
    """The sink key and thresholds, before any work: one line naming what is wrong."""
    if not (key in (None, "first", "last") or isinstance(key, int) and not isinstance(key, bool)):
        raise ConfigError(f"key={key!r}: the sink key is first, last or an index (e.g. 0)")
    if not epsilons or any(not 0 < float(e) < 1 for e in epsilons):
        raise ConfigError(f"epsilons={list(epsilons)}: each sink threshold must lie in (0, 1), "
                          f"e.g. [0.3, 0.2]")


def sink_importance(weights: Tensor, key_padding_mask: Tensor | None = None,
                    query_padding_mask: Tensor | None = None, causal: bool = False,
                    key="first") -> Tensor:
    """(B, H) float64: the mean weight on each row's sink key over the queries that see it (NaN
    where none does: a padded sink, an empty row)."""
    B, _, _, S_k = weights.shape
    pairs = visible_pairs(weights.shape, key_padding_mask, query_padding_mask, causal, weights.device)
    k = sink_key_index(key_padding_mask, B, S_k, key).to(weights.device)
    rows = torch.arange(B, device=weights.device)
    column = weights.double()[rows, :, :, k]  # (B, H, S_q): every query's weight on the sink
    seen = pairs[rows, :, k]  # (B, S_q)
    total = (column * seen[:, None, :]).sum(-1)
    return total / seen.sum(-1, keepdim=True).double()  # 0 / 0 = NaN: no query sees it


def zero_counts(weights: Tensor, key_padding_mask: Tensor | None = None,
                query_padding_mask: Tensor | None = None, causal: bool = False) -> tuple[int, int]:
    """(exactly-zero weights, pairs) over the visible (query, key) pairs of every head."""
    pairs = visible_pairs(weights.shape, key_padding_mask, query_padding_mask, causal, weights.device)
    zeros = ((weights == 0) & pairs[:, None]).sum()
    return int(zeros), int(pairs.sum()) * weights.shape[1]


# ----------------------------------------------------------------------------- hidden states
def _valid_values(hidden: Tensor, padding_mask: Tensor | None) -> list[Tensor]:
    """Each sequence's valid positions x features, flattened, float64."""
    h = hidden.double()
    if padding_mask is None:
        return list(h.flatten(1))
    return [h[b][~padding_mask[b]].flatten() for b in range(h.shape[0])]


def kurtosis_per_sequence(hidden: Tensor, padding_mask: Tensor | None = None) -> Tensor:
    """(B,) Bondarenko's kurtosis of each sequence's valid values: mu4 / (s^4 + 1e-6), s unbiased."""
    out = []
    for x in _valid_values(hidden, padding_mask):
        mu4 = (x - x.mean()).pow(4).mean()
        out.append(mu4 / (x.std().pow(4) + KURTOSIS_EPS))
    return torch.stack(out)


def top_and_median(hidden: Tensor, padding_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(B,), (B,): each sequence's largest |h| and torch.median(|h|) (the lower middle value)."""
    values = [x.abs() for x in _valid_values(hidden, padding_mask)]
    return torch.stack([v.max() for v in values]), torch.stack([v.median() for v in values])


def power_sums(hidden: Tensor, padding_mask: Tensor | None = None) -> Tensor:
    """(5,) float64: n, sum x, sum x^2, sum x^3, sum x^4 over every valid value (pooled moments)."""
    x = torch.cat(_valid_values(hidden, padding_mask))
    return torch.stack([x.new_tensor(float(x.numel()))] + [x.pow(p).sum() for p in (1, 2, 3, 4)])


def pooled_kurtosis(sums: Tensor) -> float:
    """m4 / m2^2 (population moments) from `power_sums` added over batches."""
    n, s1, s2, s3, s4 = (float(v) for v in sums)
    if n == 0:
        return math.nan
    mean = s1 / n
    m2 = s2 / n - mean**2
    m4 = s4 / n - 4 * mean * s3 / n + 6 * mean**2 * s2 / n - 3 * mean**4
    return m4 / m2**2 if m2 > 0 else math.nan


# ----------------------------------------------------------------------------- over batches
class LayerOutliers(Metric):
    """One layer's sink rates, zero share and hidden-state outliers over batches (reduced across
    DDP processes). update() takes the layer's weights and hidden state; compute() the numbers
    named in the module docstring; `distributions()` the per-(sequence, head) sink importances and
    per-sequence kurtoses seen (for histograms)."""

    full_state_update = False

    def __init__(self, key="first", epsilons=EPSILONS, **kwargs) -> None:
        super().__init__(**kwargs)
        check_options(key, epsilons)
        self.key, self.epsilons = key, tuple(float(e) for e in epsilons)
        zero = torch.tensor(0.0, dtype=torch.float64)
        for name in ("heads", "zeros", "pairs", "sequences", "kurtosis_sum", "max_abs_sum",
                     "median_sum", "largest"):
            self.add_state(name, default=zero.clone(), dist_reduce_fx="max" if name == "largest" else "sum")
        self.add_state("above", default=torch.zeros(len(self.epsilons), dtype=torch.float64),
                       dist_reduce_fx="sum")
        self.add_state("sums", default=torch.zeros(5, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("importances", default=[], dist_reduce_fx="cat")
        self.add_state("kurtoses", default=[], dist_reduce_fx="cat")

    def update(self, weights: Tensor, hidden: Tensor | None, key_padding_mask: Tensor | None = None,
               query_padding_mask: Tensor | None = None, causal: bool = False) -> None:
        importance = sink_importance(weights, key_padding_mask, query_padding_mask, causal, self.key)
        counted = importance[~importance.isnan()]
        self.heads += counted.numel()
        self.above += torch.stack([(counted > eps).sum().double() for eps in self.epsilons])
        self.importances.append(counted.float())
        zeros, pairs = zero_counts(weights, key_padding_mask, query_padding_mask, causal)
        self.zeros += zeros
        self.pairs += pairs
        if hidden is None:
            return
        positions = query_padding_mask if hidden.shape[1] == weights.shape[2] else None
        kurt = kurtosis_per_sequence(hidden, positions)
        top, median = top_and_median(hidden, positions)
        self.sequences += kurt.numel()
        self.kurtosis_sum += kurt.sum()
        self.max_abs_sum += top.sum()
        self.median_sum += median.sum()
        self.largest = torch.maximum(self.largest, top.max())
        self.sums += power_sums(hidden, positions)
        self.kurtoses.append(kurt.float())

    def compute(self) -> dict[str, float]:
        out = {}
        for eps, above in zip(self.epsilons, self.above):
            name = "sink_rate" if eps == self.epsilons[0] else f"sink_rate_eps{eps:g}"
            out[name] = float(above / self.heads) if self.heads else math.nan
        out["zero_share"] = float(self.zeros / self.pairs) if self.pairs else math.nan
        if self.sequences:
            n = float(self.sequences)
            out.update(kurtosis=float(self.kurtosis_sum) / n, pooled_kurtosis=pooled_kurtosis(self.sums),
                       max_abs=float(self.max_abs_sum) / n, largest_abs=float(self.largest),
                       median_abs=float(self.median_sum) / n)
            out["top1_over_median"] = (out["max_abs"] / out["median_abs"] if out["median_abs"] > 0
                                       else math.inf)
        return out

    def distributions(self) -> dict[str, Tensor]:
        return {"sink_importance": concatenated(self.importances).flatten().cpu(),
                "kurtosis": concatenated(self.kurtoses).flatten().cpu()}


def summarize(layers: dict[int, dict[str, float]]) -> dict[str, float]:
    """The model's numbers from its layers': means over layers (sink rates, zero share, kurtosis as
    Bondarenko's "avg kurtosis"), the maxima of kurtosis and |activation|."""
    out = {}
    names = sorted({k for v in layers.values() for k in v})
    for name in names:
        values = [v[name] for v in layers.values() if name in v and not math.isnan(v[name])]
        if not values:
            continue
        out[name] = max(values) if name == "largest_abs" else sum(values) / len(values)
        if name == "kurtosis":
            out["max_kurtosis"] = max(values)
        if name == "max_abs":
            out["max_layer_max_abs"] = max(values)
    return out


# ----------------------------------------------------------------------------- the console
COLUMNS = (("sink_rate", "sink rate"), ("sink_rate_eps0.2", "@0.2"), ("zero_share", "zeros"),
           ("kurtosis", "kurtosis"), ("max_abs", "max |h|"), ("top1_over_median", "top1/median"))


def table(metrics: dict[str, float], prefix: str = "diagnostics", title: str = "sinks and outliers"):
    """A rich Table of `<prefix>/layer{l}/<name>` and `<prefix>/<name>` values (None if none)."""
    from rich.table import Table

    rows: dict[str, dict[str, float]] = {}
    for key, value in metrics.items():
        parts = key.split("/")
        if parts[0] != prefix or len(parts) not in (2, 3):
            continue
        row = parts[1] if len(parts) == 3 else "all layers"
        rows.setdefault(row, {})[parts[-1]] = value
    if not rows:
        return None
    out = Table(title=title, show_header=True, header_style="bold")
    out.add_column("layer")
    for _, label in COLUMNS:
        out.add_column(label, justify="right")
    order = sorted((r for r in rows if r.startswith("layer")), key=lambda r: int(r[5:]))
    for row in order + [r for r in rows if not r.startswith("layer")]:
        out.add_row(row, *(f"{rows[row][k]:.4g}" if k in rows[row] else "" for k, _ in COLUMNS))
    return out

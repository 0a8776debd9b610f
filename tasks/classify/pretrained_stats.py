"""Explaining away in the packaged pretrained BERT: column sums per layer and head on real text.

`texts_as_batches` turns Debian package descriptions into 128-token WordPiece inputs (packed in
order, so every input has S = 128 keys and no padding); `column_statistics`
runs a BERT with an attnlab scheme (`tasks.classify.pretrained.load_pretrained_bert`; UNAS there
is the model's own softmax, equal to HF's eager attention: tests/hf/) under `record_attention`
and gives, per layer and head, the share of keys whose column sum is below 1e-8 (the DNAS
paper's epsilon) and 1e-3, the minimum column sum x S (>= 1 would be the DNAS lemma's bound),
and every log10 column sum for histograms.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from attnlab.attention import record_attention
from attnlab.attention.statistics import LOG_FLOOR
from tasks.common import bert_assets

THRESHOLDS = (1e-8, 1e-3)
LENGTH = 128


def texts_as_batches(texts: Sequence[str], count: int, batch_size: int = 16,
                     length: int = LENGTH) -> list[tuple[Tensor, Tensor]]:
    """(input_ids, attention_mask) batches of `count` inputs of exactly `length` tokens: the
    texts' word pieces in order, each text followed by [SEP] (as mlm packs paragraphs), cut into
    [CLS] + length - 2 pieces + [SEP]. No padding, so every input has S = length keys."""
    tokenizer = bert_assets.load_tokenizer(None)
    body = length - 2
    stream: list[int] = []
    for start in range(0, len(texts), 256):
        for encoding in tokenizer.encode_batch(list(texts[start:start + 256]), add_special_tokens=False):
            stream += [*encoding.ids, bert_assets.SEP_ID]
        if len(stream) >= count * body:
            break
    chunks = [[bert_assets.CLS_ID, *stream[i:i + body], bert_assets.SEP_ID]
              for i in range(0, min(len(stream), count * body) - body + 1, body)]
    if not chunks:
        return []
    ids = torch.tensor(chunks, dtype=torch.long)
    return [(chunk, torch.ones_like(chunk)) for chunk in ids.split(batch_size)]


@dataclass
class HeadColumns:
    """Column sums of one attention layer, gathered over batches."""

    heads: int
    counts: np.ndarray = field(init=False)  # valid keys seen
    below: dict[float, np.ndarray] = field(init=False)  # per threshold, keys below it, per head
    min_x_s: np.ndarray = field(init=False)  # min over keys of c_j * S, per head
    logs: list[np.ndarray] = field(default_factory=list)  # log10 c_j, every valid key

    def __post_init__(self) -> None:
        self.counts = np.zeros(self.heads)
        self.below = {t: np.zeros(self.heads) for t in THRESHOLDS}
        self.min_x_s = np.full(self.heads, np.inf)

    def add(self, sums: Tensor, key_padding_mask: Tensor | None) -> None:
        """sums (B, H, S_k) of one batch."""
        b, h, s = sums.shape
        valid = torch.ones(b, s, dtype=torch.bool) if key_padding_mask is None else ~key_padding_mask.cpu()
        sums = sums.double().cpu()
        size = valid.sum(-1).double()[:, None, None]  # S of each example
        keep = valid[:, None, :].expand(b, h, s)
        self.counts += keep.sum((0, 2)).numpy()
        for t in THRESHOLDS:
            self.below[t] += ((sums < t) & keep).sum((0, 2)).numpy()
        scaled = (sums * size).masked_fill(~keep, float("inf"))
        self.min_x_s = np.minimum(self.min_x_s, scaled.amin((0, 2)).numpy())
        self.logs.append(np.log10(sums[keep].clamp_min(LOG_FLOOR).numpy()))

    def share(self, threshold: float) -> np.ndarray:
        return self.below[threshold] / np.maximum(self.counts, 1)

    def log_sums(self) -> np.ndarray:
        return np.concatenate(self.logs) if self.logs else np.zeros(0)


@torch.no_grad()
def column_statistics(bert: torch.nn.Module, batches: Sequence[tuple[Tensor, Tensor]],
                      progress=None) -> list[HeadColumns]:
    """Per attention layer of `bert` (in order), its `HeadColumns` over `batches`."""
    bert.eval()
    layers: dict[str, HeadColumns] = {}
    for ids, mask in batches:
        with record_attention(bert) as recorder:
            bert(input_ids=ids, attention_mask=mask)
        for name, record in recorder.records.items():
            stats = layers.setdefault(name, HeadColumns(record.weights.shape[1]))
            stats.add(record.column_sums, record.key_padding_mask)
        if progress is not None:
            progress()
    return list(layers.values())


def hybrid_u(bert: torch.nn.Module) -> list[np.ndarray]:
    """HNAS's u per head of each layer (empty for other schemes)."""
    from attnlab.attention import scheme_values

    return [u.numpy() for u in scheme_values(bert).get("hnas_u", {}).values()]

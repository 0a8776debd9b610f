"""One protocol for recording attention: `record_attention`.

    with record_attention(model) as rec:        # or a list of (name, module) / modules
        model(batch)
    rec.records["encoder.layers.0.self_attn"]   # an AttentionRecord

While a recorder is open, each chosen MultiHeadAttention materializes its weights (the scheme's
reference, or the cascade's own weights) and hands one `AttentionRecord` to every open recorder
that wants it; nothing is computed when none is open, so training never pays unless it asks.
Recorders nest: callbacks and the task itself may record the same modules at once, each gets
the record, and closing one leaves the others open. By default a recorder keeps the first forward
of each module while it is open (open it around one batch); `first_only=False` keeps a list.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from torch import nn

from attnlab.attention.mha import MultiHeadAttention, attention_modules
from attnlab.attention.record import AttentionRecord

if TYPE_CHECKING:  # typing.Self is Python 3.11+
    from typing_extensions import Self


class record_attention:
    def __init__(self, target: nn.Module | Iterable, first_only: bool = True) -> None:
        if isinstance(target, nn.Module):
            pairs = attention_modules(target)
        else:
            items = list(target)
            pairs = [(str(i), m) if isinstance(m, MultiHeadAttention) else tuple(m)
                     for i, m in enumerate(items)]
            pairs = [(name, m) for name, m in pairs if isinstance(m, MultiHeadAttention)]
        self.modules = dict(pairs)
        self._names = {id(m): name for name, m in pairs}
        self.first_only = first_only
        self.records: dict[str, AttentionRecord | list[AttentionRecord]] = {}
        self.is_open = False

    def open(self) -> Self:
        if not self.is_open:
            for module in self.modules.values():
                module._recorders.append(self)
            self.is_open = True
        return self

    def close(self) -> None:
        if self.is_open:
            for module in self.modules.values():
                module._recorders.remove(self)
            self.is_open = False

    def __enter__(self) -> Self:
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()

    def wants(self, module: nn.Module) -> bool:
        return not (self.first_only and self._names[id(module)] in self.records)

    def receive(self, module: nn.Module, record: AttentionRecord) -> None:
        name = self._names[id(module)]
        if self.first_only:
            self.records[name] = record
        else:
            self.records.setdefault(name, []).append(record)

    def take(self) -> dict:
        """The records so far, and a fresh start."""
        records, self.records = self.records, {}
        return records

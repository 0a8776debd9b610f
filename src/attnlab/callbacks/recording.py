"""Shared switch for `MultiHeadAttention.record`: several analyses may record at once.

Each user starts and stops recording under its own name; a module records while at least one
owner wants it, and nobody clears `recorded` for the others (the next forward overwrites it).
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn

from attnlab.attention import MultiHeadAttention, attention_modules


def set_recording(target: nn.Module | Iterable[MultiHeadAttention], owner: str, on: bool) -> None:
    """Switch recording for `owner` on every attention module of a model (or the given modules)."""
    if isinstance(target, nn.Module):
        modules = [m for _, m in attention_modules(target)]
    else:
        modules = list(target)
    for module in modules:
        owners = module.__dict__.setdefault("_record_owners", set())
        if on:
            owners.add(owner)
        else:
            owners.discard(owner)
        module.record = bool(owners)
        if not module.record:
            module.recorded = None

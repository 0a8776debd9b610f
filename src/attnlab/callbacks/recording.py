"""Shared switch for `MultiHeadAttention.record`: several analysis callbacks may record at once.

Each callback starts and stops recording under its own name; a module records while at least one
owner wants it, and nobody clears `recorded` for the others (the next forward overwrites it).
"""

from __future__ import annotations

from attnlab.attention import attention_modules


def set_recording(model, owner: str, on: bool) -> None:
    for _, module in attention_modules(model):
        owners = module.__dict__.setdefault("_record_owners", set())
        if on:
            owners.add(owner)
        else:
            owners.discard(owner)
        module.record = bool(owners)
        if not module.record:
            module.recorded = None

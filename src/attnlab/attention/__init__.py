"""Attention schemes (UNAS, DNAS, HNAS, Sinkhorn, entmax; CODA, RealFormer), the functional API,
modules, layers, stacks, incremental decoding (KV caches) and recording.

See docs/architecture.md for the contract of every public name.
"""

from attnlab.attention.functional import attend, attention_weights, reference_attend
from attnlab.attention.kv_cache import DecoderCache, KeyValues, KVCache, PrefixCache, cacheable
from attnlab.attention.layers import StackCarry, TransformerDecoderLayer, TransformerEncoderLayer
from attnlab.attention.mha import MultiHeadAttention, attention_modules
from attnlab.attention.record import AttentionRecord
from attnlab.attention.recording import record_attention
from attnlab.attention.schemes import (
    LogitTransform,
    Normalizer,
    names,
    query_normalized,
    register,
    scheme_parameters,
)
from attnlab.attention.schemes.hnas import hybrid_u_per_layer
from attnlab.attention.spec import AttentionSpec
from attnlab.attention.stack import run_stack, step_stack
from attnlab.attention.statistics import ColumnStats, column_sums

__all__ = [
    "AttentionRecord",
    "AttentionSpec",
    "ColumnStats",
    "DecoderCache",
    "KVCache",
    "KeyValues",
    "LogitTransform",
    "MultiHeadAttention",
    "Normalizer",
    "PrefixCache",
    "StackCarry",
    "TransformerDecoderLayer",
    "TransformerEncoderLayer",
    "attend",
    "attention_modules",
    "attention_weights",
    "cacheable",
    "column_sums",
    "hybrid_u_per_layer",
    "names",
    "query_normalized",
    "record_attention",
    "reference_attend",
    "register",
    "run_stack",
    "scheme_parameters",
    "step_stack",
]

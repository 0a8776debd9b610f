"""Attention schemes (UNAS, DNAS, HNAS, Sinkhorn, entmax, sigmoid, sink, softpick, SSMax,
stick-breaking; CODA, RealFormer), the functional API,
modules, layers, stacks, incremental decoding (KV caches), positions inside attention (RoPE,
ALiBi) and recording.

See docs/architecture.md for the contract of every public name.
"""

from attnlab.attention.functional import attend, attention_weights, reference_attend
from attnlab.attention.gate import OutputGate
from attnlab.attention.kv_cache import DecoderCache, KeyValues, KVCache, PrefixCache, cacheable
from attnlab.attention.layers import StackCarry, TransformerDecoderLayer, TransformerEncoderLayer
from attnlab.attention.mha import MultiHeadAttention, attention_modules
from attnlab.attention.positions import AttentionPositions, alibi_slopes, rope
from attnlab.attention.record import AttentionRecord
from attnlab.attention.recording import record_attention
from attnlab.attention.schemes import (
    HeadScheme,
    LogitTransform,
    Normalizer,
    names,
    query_normalized,
    register,
    scheme_parameters,
    scheme_values,
)
from attnlab.attention.spec import AttentionSpec
from attnlab.attention.stack import run_stack, step_stack
from attnlab.attention.statistics import ColumnStats, column_sums

__all__ = [
    "AttentionPositions",
    "AttentionRecord",
    "AttentionSpec",
    "ColumnStats",
    "DecoderCache",
    "HeadScheme",
    "KVCache",
    "KeyValues",
    "LogitTransform",
    "MultiHeadAttention",
    "Normalizer",
    "OutputGate",
    "PrefixCache",
    "StackCarry",
    "TransformerDecoderLayer",
    "TransformerEncoderLayer",
    "alibi_slopes",
    "attend",
    "attention_modules",
    "attention_weights",
    "cacheable",
    "column_sums",
    "names",
    "query_normalized",
    "record_attention",
    "reference_attend",
    "register",
    "rope",
    "run_stack",
    "scheme_parameters",
    "scheme_values",
    "step_stack",
]

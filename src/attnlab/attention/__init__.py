"""Attention schemes (UNAS, DNAS, HNAS, Sinkhorn, entmax; CODA, RealFormer), the functional API,
modules, layers, stacks and recording.

See docs/architecture.md for the contract of every public name.
"""

from attnlab.attention.functional import attend, attention_weights, reference_attend
from attnlab.attention.layers import StackCarry, TransformerDecoderLayer, TransformerEncoderLayer
from attnlab.attention.mha import MultiHeadAttention, attention_modules
from attnlab.attention.recording import AttentionRecord, record_attention
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
from attnlab.attention.stack import run_stack
from attnlab.attention.statistics import ColumnStats, column_sums

__all__ = [
    "AttentionRecord",
    "AttentionSpec",
    "ColumnStats",
    "LogitTransform",
    "MultiHeadAttention",
    "Normalizer",
    "StackCarry",
    "TransformerDecoderLayer",
    "TransformerEncoderLayer",
    "attend",
    "attention_modules",
    "attention_weights",
    "column_sums",
    "hybrid_u_per_layer",
    "names",
    "query_normalized",
    "record_attention",
    "reference_attend",
    "register",
    "run_stack",
    "scheme_parameters",
]

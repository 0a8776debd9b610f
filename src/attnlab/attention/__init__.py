"""Attention schemes (UNAS, DNAS, HNAS, Sinkhorn), the functional API, modules and layers.

See docs/architecture.md for the contract of every public name.
"""

from attnlab.attention.functional import attend, attention_weights
from attnlab.attention.layers import TransformerDecoderLayer, TransformerEncoderLayer
from attnlab.attention.mha import MultiHeadAttention, attention_modules
from attnlab.attention.spec import QUERY_NORMALIZED, SCHEMES, AttentionSpec

__all__ = [
    "attend",
    "attention_weights",
    "MultiHeadAttention",
    "TransformerEncoderLayer",
    "TransformerDecoderLayer",
    "attention_modules",
    "AttentionSpec",
    "SCHEMES",
    "QUERY_NORMALIZED",
]

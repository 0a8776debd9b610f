"""Attention schemes (UNAS, DNAS, HNAS, Sinkhorn; CODA, RealFormer), the functional API, modules
and layers.

See docs/architecture.md for the contract of every public name.
"""

from attnlab.attention.cascade import link_stack
from attnlab.attention.functional import attend, attention_weights
from attnlab.attention.layers import TransformerDecoderLayer, TransformerEncoderLayer
from attnlab.attention.mha import MultiHeadAttention, attention_modules
from attnlab.attention.spec import CASCADE_SCHEMES, QUERY_NORMALIZED, SCHEMES, AttentionSpec

__all__ = [
    "CASCADE_SCHEMES",
    "QUERY_NORMALIZED",
    "SCHEMES",
    "AttentionSpec",
    "MultiHeadAttention",
    "TransformerDecoderLayer",
    "TransformerEncoderLayer",
    "attend",
    "attention_modules",
    "attention_weights",
    "link_stack",
]

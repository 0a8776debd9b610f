"""attnlab's schemes in any `transformers` model (docs/hf.md).

    from attnlab.hf import use_scheme
    model = BertModel.from_pretrained(path)
    use_scheme(model, "hnas", hybrid_init=0.5)     # every self-attention runs HNAS, u per head
    with record_attention(model) as rec: model(**batch)   # attnlab's analyses see it

`use_scheme` registers the function "attnlab" with transformers' `AttentionInterface` and sets
it as the model's attn_implementation; `from_pretrained` loads a saved model with its scheme.
"""

from attnlab.hf.adapter import SchemeAttention
from attnlab.hf.install import from_pretrained, hf_attention_modules, use_scheme
from attnlab.hf.interface import IMPLEMENTATION, attnlab_attention, register

__all__ = [
    "IMPLEMENTATION",
    "SchemeAttention",
    "attnlab_attention",
    "from_pretrained",
    "hf_attention_modules",
    "register",
    "use_scheme",
]

"""`SchemeAttention`: an attnlab scheme inside one attention module of a Hugging Face model.

`attnlab.hf.use_scheme` adds one to every attention module of the model (as its child
`attnlab`), and the registered attention function (`attnlab.hf.interface`) hands it the HF
module's projected, split heads. It is a `MultiHeadAttention` without projections (the HF module
keeps its own), so everything attnlab finds by that type sees it with no code of its own:
`record_attention` and the analysis callbacks (explained away, head diversity, head importance:
its output is the concatenation of the heads, head-major, as for `project_values=False`), the
scheme's parameters (HNAS's u lives on `self.normalizer`, a child, so it is in
`model.parameters()`, the state dict and `save_pretrained`), `parameter_groups` (at the scheme's `param_lr`).
"""

from __future__ import annotations

from torch import Tensor, nn

from attnlab.attention.mha import MultiHeadAttention
from attnlab.attention.spec import AttentionSpec
from attnlab.errors import ConfigError


class SchemeAttention(MultiHeadAttention):
    """The scheme of `spec` on (B, H, S, d) heads given by a HF attention module.

    `role`: "encoder" (bidirectional self-attention), "decoder" (causal self-attention) or
    "cross"; `layer_index`: position among the model's attention modules.
    """

    def __init__(self, spec: AttentionSpec, num_heads: int, head_dim: int, role: str = "encoder",
                 layer_index: int = 0) -> None:
        # MultiHeadAttention.__init__ would build projections the HF module already has.
        nn.Module.__init__(self)
        if spec.gate is not None or spec.head_scheme is not None:
            raise ConfigError(f"attnlab.hf runs a scheme on the HF module's own projections; "
                              f"{'model.gate=' + spec.gate if spec.gate else 'model=' + spec.scheme} "
                              f"needs parameters of its own there (train it in an attnlab task)")
        self.spec = spec
        self.embed_dim = num_heads * head_dim
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.kdim = self.vdim = self.out_dim = self.embed_dim
        self.dropout = 0.0  # set by each call from what the HF module configures (see forward)
        self.is_decoder = role != "encoder"
        self.project_values = False
        self.layer_index = int(layer_index)
        self.q_proj = self.k_proj = self.v_proj = self.out_proj = None
        self.normalizer = spec.build_normalizer(num_heads)
        # only non-cascading transforms reach here (use_scheme refuses the others)
        self.transform = spec.build_transform(num_heads, receives_logits=False)
        self.head_scheme = self.gate = None  # refused above
        self.role = role
        self.causal = role == "decoder"
        self._recorders: list = []

    def forward(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None = None,
                query_padding_mask: Tensor | None = None, causal: bool = False,
                dropout_p: float = 0.0) -> Tensor:
        """(B, H, S_q, d) heads in, (B, S_q, H * d) out (heads concatenated, head-major).

        Called as a module so that forward hooks (HeadImportance's masked heads) see the heads.
        `dropout_p` is the HF module's own (its config's attention dropout while training, 0 in
        eval): attend_heads reads it from `self.dropout` and `self.training`, as in attnlab's layers.
        """
        self.dropout = float(dropout_p)
        out, _ = self.attend_heads(q, k, v, key_padding_mask, query_padding_mask, causal)
        return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)

    def extra_repr(self) -> str:
        return f"{self.spec.scheme}, heads={self.num_heads}, head_dim={self.head_dim}, role={self.role}"

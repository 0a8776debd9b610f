"""`OutputGate`: the gated attention output of Qiu et al. 2025 ("Gated Attention for Large
Language Models", arXiv 2505.06708), composable with every scheme (`model.gate=`).

Each head's attention output Y_h (B, S_q, d) is multiplied, before the output projection, by
`sigmoid(X W_g)`, X the attention's query input (B, S_q, E):
- `headwise`: one gate per head and token, W_g of E x H;
- `elementwise`: one per output feature, W_g of E x (H d).

The published code (qiuzh20/gated_attention, modeling_qwen3.py) takes the gate logits from extra
output columns of `q_proj` (per head: its d query columns, then its 1 or d gate columns); a
separate `nn.Linear` here is the same map with its rows in another order, and keeps the module's
`q_proj` (and so BERT's weight names) as it is. Initialization as theirs: the weights
N(0, 0.02) (their `initializer_range`), the bias 0, so every gate starts near sigmoid(0) = 0.5:
the gate starts as a halving of the attention output (exactly 0.5 in expectation over the
weights), not as the identity.

A `SchemeModule` like the schemes (attention/schemes/base.py): it holds no parameter of its own
(W_g is a submodule's, trained and decayed as the model's weights, as the published code's
`q_proj`). `reported()` gives, per head, what the last forward's gates were (detached, on the
valid query positions): `mean` and `closed` (the share of gates < 0.1); `scheme_values` reports
them as `gate_mean` and `gate_closed`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.attention.schemes.base import SchemeModule
from attnlab.errors import ConfigError

GATES = ("headwise", "elementwise")
CLOSED = 0.1  # a gate below this counts as closed
INIT_STD = 0.02  # the published code's initializer_range


def check_gate(gate: object) -> str | None:
    """`model.gate` as a kind (None: no gate); one-line ConfigError otherwise."""
    if gate is None or (isinstance(gate, str) and gate.lower() in ("null", "none")):
        return None
    if not isinstance(gate, str) or gate.lower() not in GATES:
        raise ConfigError(f"model.gate={gate!r}: choose model.gate=headwise, model.gate=elementwise "
                          f"or model.gate=null (no gate)")
    return gate.lower()


class OutputGate(SchemeModule):
    """sigmoid(x W_g + b) times the heads' outputs; x (B, S_q, E), heads (B, H, S_q, d)."""

    name = "gate"

    def __init__(self, kind: str, embed_dim: int, num_heads: int, head_dim: int,
                 bias: bool = True) -> None:
        super().__init__(None, int(num_heads))
        self.kind = check_gate(kind)
        if self.kind is None:
            raise ConfigError("OutputGate needs kind headwise or elementwise")
        self.head_dim = int(head_dim)
        width = num_heads if self.kind == "headwise" else num_heads * head_dim
        self.proj = nn.Linear(embed_dim, width, bias=bias)
        nn.init.normal_(self.proj.weight, mean=0.0, std=INIT_STD)
        if self.proj.bias is not None:
            nn.init.zeros_(self.proj.bias)
        self._stats: dict[str, Tensor] = {}

    def extra_repr(self) -> str:
        return self.kind

    def gates(self, x: Tensor) -> Tensor:
        """(B, H, S_q, 1) headwise or (B, H, S_q, d) elementwise, in [0, 1]."""
        b, s, _ = x.shape
        g = torch.sigmoid(self.proj(x))
        g = g.view(b, s, self.num_heads, -1)  # headwise: (B, S, H, 1)
        return g.transpose(1, 2)

    def forward(self, x: Tensor, heads: Tensor, query_padding_mask: Tensor | None = None) -> Tensor:
        g = self.gates(x)
        self._remember(g.detach(), query_padding_mask)  # stays on the device: no sync
        return heads * g.to(heads.dtype)

    @torch.no_grad()
    def _remember(self, g: Tensor, query_padding_mask: Tensor | None) -> None:
        """Per head: mean gate and share of gates < CLOSED over the valid query positions."""
        g = g.float()
        rows = torch.ones(g.shape[0], g.shape[2], dtype=g.dtype, device=g.device)
        if query_padding_mask is not None:
            rows = (~query_padding_mask).to(g.dtype)
        weight = rows[:, None, :, None].expand_as(g)  # (B, H, S, w)
        count = weight.sum(dim=(0, 2, 3)).clamp(min=1.0)
        self._stats = {
            "mean": (g * weight).sum(dim=(0, 2, 3)) / count,
            "closed": ((g < CLOSED).to(g.dtype) * weight).sum(dim=(0, 2, 3)) / count,
        }

    def reported(self) -> dict[str, Tensor]:
        """{"mean": (H,), "closed": (H,)} of the last forward (empty before the first)."""
        return dict(self._stats)

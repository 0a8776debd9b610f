"""The multi-view VQA model: a fusion layer over detector views, then a Pythia-like backbone.

Fusion (doubly-normalized attention paper, Sec. 6.1 and App. B): queries from the primary
view's boxes, keys `K_s x^s_j` from each secondary view s, values the raw secondary features:

    y_i = LayerNorm(x^P_i + sum_s sum_j pi^s_ij x^s_j)

with pi^s from the attention scheme chosen by `model=` (one MultiHeadAttention per secondary
view, so the analysis callbacks see one "layer" per secondary view). Baselines of the paper's
Table 1: `primary` (primary boxes only) and `concat` (all views' boxes straight into the
backbone).

Backbone (Pythia-like): word embeddings + GRU/LSTM question encoding, question-guided top-down
attention over the boxes (softmax over boxes, `glimpses` of them), element-wise product of the
attended image vector and the question vector, MLP classifier over the answer vocabulary.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence

from attnlab.attention import AttentionSpec, MultiHeadAttention
from attnlab.config_schema import POSITIVE_INT, Rule
from attnlab.errors import ConfigError

FUSIONS = ("attention", "primary", "concat")


class MultiViewFusion(nn.Module):
    """y_i = LayerNorm(x^P_i + sum_s attn_s(x^P_i, x^s, x^s)), values not projected.

    `init="similarity"` (default) starts the query and key projections at the identity, so the
    fusion starts as scaled dot-product similarity between a primary box and the secondary boxes
    (boxes of one object look alike across detectors) and training sharpens or reshapes it;
    `init="random"` keeps PyTorch's default initialization. From random projections the fusion
    of the synthetic benchmark stayed near-uniform for the whole CPU budget, so every scheme
    reduced to adding the mean secondary box.
    """

    def __init__(
        self,
        dim: int,
        num_views: int,
        spec: AttentionSpec,
        num_heads: int = 1,
        dropout: float = 0.1,
        primary_view: int = 0,
        init: str = "similarity",
        init_scale: float = 1.0,
    ) -> None:
        super().__init__()
        if not 0 <= primary_view < num_views:
            raise ConfigError(
                f"task.module.net.primary_view={primary_view} but the data has {num_views} views"
            )
        if num_views < 2:
            raise ConfigError("attention fusion needs at least 2 views; use task.fusion=primary")
        if num_heads < 1 or dim % num_heads:
            fits = ", ".join(str(h) for h in range(1, min(dim, 16) + 1) if dim % h == 0)
            raise ConfigError(f"task.module.net.fusion_heads={num_heads} must divide the box "
                              f"features' size {dim} (the heads split it); use one of {fits}, "
                              f"e.g. task.module.net.fusion_heads=1")
        self.primary_view = primary_view
        self.secondary_views = [v for v in range(num_views) if v != primary_view]
        self.attention = nn.ModuleList(
            MultiHeadAttention(
                dim, num_heads, spec=spec, dropout=dropout, kdim=dim, vdim=dim, project_values=False
            )
            for _ in self.secondary_views
        )
        if init not in ("similarity", "random"):
            raise ConfigError(f"task.module.net.fusion_init={init!r}; use similarity or random")
        if init == "similarity":
            with torch.no_grad():
                for attention in self.attention:
                    for proj, scale in ((attention.q_proj, init_scale), (attention.k_proj, 1.0)):
                        proj.weight.copy_(scale * torch.eye(dim))
                        if proj.bias is not None:
                            proj.bias.zero_()
        self.norm = nn.LayerNorm(dim)

    def forward(self, features: Tensor, box_mask: Tensor) -> tuple[Tensor, Tensor]:
        """features (B, V, N, D), box_mask (B, V, N) True = padding -> (B, N, D), (B, N)."""
        primary = features[:, self.primary_view]
        primary_mask = box_mask[:, self.primary_view]
        fused = primary
        for view, attention in zip(self.secondary_views, self.attention):
            secondary = features[:, view]
            fused = fused + attention(
                primary,
                secondary,
                secondary,
                # a copy at offset 0: compiled, a view's storage offset (view * N) is a size
                # too, and duck sizing tied it to N (equal at view 1), a guard the next view failed
                key_padding_mask=box_mask[:, view].contiguous(),
                query_padding_mask=primary_mask,
            )
        return self.norm(fused), primary_mask


class QuestionEncoder(nn.Module):
    """Word embeddings + GRU/LSTM; the question vector is the final state (of both directions
    when bidirectional, each of hidden_dim // 2 units).

    Bidirectional by default: a forward-only GRU must carry the content words ("red cube") to
    the end of the question through the fixed tail ("are there ?"), and on the synthetic
    benchmark it sat ~1000 steps on a plateau before it started to ground the question; the
    backward direction ends on the first words and learns within a few hundred steps.
    """

    def __init__(
        self,
        vocab_size: int,
        embed_dim: int,
        hidden_dim: int,
        rnn: str = "gru",
        bidirectional: bool = True,
    ) -> None:
        super().__init__()
        if rnn not in ("gru", "lstm"):
            raise ConfigError(f"task.module.net.rnn={rnn!r}; use gru or lstm")
        if bidirectional and hidden_dim % 2:
            raise ConfigError(
                f"a bidirectional question encoder splits hidden_dim={hidden_dim} over two "
                f"directions; use an even task.module.net.hidden_dim"
            )
        self.embed = nn.Embedding(vocab_size, embed_dim, padding_idx=0)
        self.rnn = (nn.GRU if rnn == "gru" else nn.LSTM)(
            embed_dim,
            hidden_dim // 2 if bidirectional else hidden_dim,
            batch_first=True,
            bidirectional=bidirectional,
        )

    def forward(self, tokens: Tensor, lengths: Tensor) -> Tensor:
        packed = pack_padded_sequence(
            self.embed(tokens), lengths.clamp(min=1).cpu(), batch_first=True, enforce_sorted=False
        )
        _, hidden = self.rnn(packed)
        if isinstance(hidden, tuple):  # LSTM: (h, c)
            hidden = hidden[0]
        if self.rnn.bidirectional:  # forward state after the last real token, backward after the first
            return torch.cat([hidden[-2], hidden[-1]], dim=-1)
        return hidden[-1]  # (B, hidden): state after each question's last real token


class TopDownAttention(nn.Module):
    """Question-guided soft attention over boxes (Anderson et al. 2018), `glimpses` maps."""

    def __init__(self, box_dim: int, question_dim: int, hidden_dim: int, glimpses: int) -> None:
        super().__init__()
        self.box_proj = nn.Linear(box_dim, hidden_dim)
        self.question_proj = nn.Linear(question_dim, hidden_dim)
        self.logits = nn.Linear(hidden_dim, glimpses)

    def forward(self, boxes: Tensor, box_mask: Tensor, question: Tensor) -> Tensor:
        # No dropout on the (B, N, hidden) product: on CPU drawing that mask costs more than the
        # rest of the layer; the question vector is dropped out before it comes here.
        joint = F.relu(self.box_proj(boxes)) * F.relu(self.question_proj(question))[:, None, :]
        logits = self.logits(joint)  # (B, N, G)
        logits = logits.masked_fill(box_mask[..., None], torch.finfo(logits.dtype).min)
        weights = torch.softmax(logits, dim=1)
        attended = torch.einsum("bng,bnd->bgd", weights, boxes)
        return attended.flatten(1)  # (B, G * D)


class VQAModel(nn.Module):
    """`attention`: the `model=` config (the fusion's scheme); sizes only the data know
    (vocab_size, num_answers, feature_dim, num_views) come from the datamodule."""

    # ranges of options no other task has, checked before any work (attnlab.config_schema)
    option_rules: ClassVar[dict[str, Rule]] = {"glimpses": Rule(POSITIVE_INT.ok, "an integer >= 1", "2")}

    def __init__(
        self,
        attention: AttentionSpec | dict | str,
        vocab_size: int,
        num_answers: int,
        feature_dim: int,
        num_views: int,
        fusion: str = "attention",
        primary_view: int = 0,
        fusion_heads: int = 1,
        fusion_dropout: float = 0.0,
        fusion_init: str = "similarity",
        fusion_init_scale: float = 1.0,
        embed_dim: int = 64,
        hidden_dim: int = 128,
        attention_dim: int = 128,
        glimpses: int = 2,
        rnn: str = "gru",
        bidirectional: bool = True,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        if fusion not in FUSIONS:
            raise ConfigError(f"task.fusion={fusion!r}; choose one of {', '.join(FUSIONS)}")
        self.fusion_mode = fusion
        self.primary_view = primary_view
        if fusion == "attention":
            self.fusion = MultiViewFusion(
                feature_dim, num_views, AttentionSpec.from_config(attention), fusion_heads, fusion_dropout, primary_view,
                fusion_init, fusion_init_scale,
            )
        else:  # the same box normalization as the fused path, so only the fusion differs
            self.box_norm = nn.LayerNorm(feature_dim)
        self.question = QuestionEncoder(vocab_size, embed_dim, hidden_dim, rnn, bidirectional)
        self.question_dropout = nn.Dropout(dropout)
        self.top_down = TopDownAttention(feature_dim, hidden_dim, attention_dim, glimpses)
        self.image_proj = nn.Linear(glimpses * feature_dim, hidden_dim)
        self.question_proj = nn.Linear(hidden_dim, hidden_dim)
        self.classifier = nn.Sequential(
            nn.Linear(hidden_dim, 2 * hidden_dim),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(2 * hidden_dim, num_answers),
        )

    def boxes(self, features: Tensor, box_mask: Tensor) -> tuple[Tensor, Tensor]:
        """The boxes the backbone sees: (B, N', D) and their padding mask (B, N')."""
        if self.fusion_mode == "attention":
            return self.fusion(features, box_mask)
        if self.fusion_mode == "primary":
            return self.box_norm(features[:, self.primary_view]), box_mask[:, self.primary_view]
        b, v, n, d = features.shape  # concat: 3 x 100 boxes
        return self.box_norm(features.reshape(b, v * n, d)), box_mask.reshape(b, v * n)

    def forward(
        self, features: Tensor, box_mask: Tensor, question: Tensor, question_length: Tensor
    ) -> Tensor:
        boxes, mask = self.boxes(features, box_mask)
        q = self.question_dropout(self.question(question, question_length))
        image = self.top_down(boxes, mask, q)
        joint = F.relu(self.image_proj(image)) * F.relu(self.question_proj(q))
        return self.classifier(joint)  # answer logits (B, A)

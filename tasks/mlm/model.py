"""A BERT encoder with a pluggable attention scheme, its tied MLM head, and BERT weight loading.

The layers are `attnlab.attention.TransformerEncoderLayer` (post-LN, GELU, eps 1e-12), so with
`spec=unas` and weights from a BERT checkpoint this is exactly HF `BertModel` (tested).
`norm_first=True` makes them pre-LN (plus a final LayerNorm): not BERT, but it trains stably at
the higher learning rates that short CPU runs need.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.attention import (
    AttentionSpec,
    TransformerEncoderLayer,
    run_stack,
    scheme_parameters,
)
from attnlab.errors import ConfigError
from tasks.common import bert_assets


class BertEmbeddings(nn.Module):
    """Token + position + segment embeddings, then LayerNorm and dropout."""

    def __init__(self, vocab_size: int, d_model: int, max_position: int, type_vocab_size: int,
                 dropout: float, layer_norm_eps: float, pad_id: int) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        self.position_embeddings = nn.Embedding(max_position, d_model)
        self.token_type_embeddings = nn.Embedding(type_vocab_size, d_model)
        self.norm = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        seq_len = input_ids.shape[1]
        if seq_len > self.position_embeddings.num_embeddings:
            raise ConfigError(
                f"sequence of {seq_len} tokens is longer than the model's "
                f"{self.position_embeddings.num_embeddings} positions; lower task.data.max_length"
            )
        positions = torch.arange(seq_len, device=input_ids.device)[None, :]
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        x = x + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.norm(x))


class BertEncoder(nn.Module):
    """Embeddings + a stack of encoder layers; every self-attention uses `spec`."""

    def __init__(self, vocab_size: int, d_model: int = 256, num_layers: int = 4, nhead: int = 4,
                 dim_feedforward: int = 1024, max_position: int = 512, type_vocab_size: int = 2,
                 dropout: float = 0.1, attn_dropout: float = 0.1, layer_norm_eps: float = 1e-12,
                 pad_id: int = 0, spec: AttentionSpec | dict | str = "unas", norm_first: bool = False) -> None:
        super().__init__()
        spec = AttentionSpec.from_config(spec)
        self.pad_id = pad_id
        self.embeddings = BertEmbeddings(vocab_size, d_model, max_position, type_vocab_size,
                                         dropout, layer_norm_eps, pad_id)
        self.layers = nn.ModuleList(
            TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout, spec=spec, activation="gelu",
                                    norm_first=norm_first, layer_norm_eps=layer_norm_eps, attn_dropout=attn_dropout,
                                    layer_index=i)
            for i in range(num_layers)
        )
        # Pre-LN layers leave the residual stream unnormalized: one LayerNorm after the stack.
        self.final_norm = nn.LayerNorm(d_model, eps=layer_norm_eps) if norm_first else nn.Identity()

    def forward(self, input_ids: Tensor, padding_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None) -> Tensor:
        """input_ids (B, S) -> hidden states (B, S, d_model). padding_mask: bool, True = padding."""
        if padding_mask is None:
            padding_mask = input_ids == self.pad_id
        x = self.embeddings(input_ids, token_type_ids)
        return self.final_norm(run_stack(self.layers, x, padding_mask))


class MLMHead(nn.Module):
    """BERT's prediction head: dense + GELU + LayerNorm, then a decoder tied to the word embeddings."""

    def __init__(self, word_embeddings: nn.Embedding, layer_norm_eps: float = 1e-12) -> None:
        super().__init__()
        vocab_size, d_model = word_embeddings.weight.shape
        self.dense = nn.Linear(d_model, d_model)
        self.activation = nn.GELU()
        self.norm = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.word_embeddings = word_embeddings  # shared module: the decoder weight *is* the embedding
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, hidden: Tensor) -> Tensor:
        h = self.norm(self.activation(self.dense(hidden)))
        return nn.functional.linear(h, self.word_embeddings.weight, self.bias)


INITS = ("random", "bert")


def bert_architecture() -> dict:
    """Encoder sizes of the packaged checkpoint, as BertForMLM keyword arguments."""
    cfg = bert_assets.bert_config()
    if cfg.get("hidden_act", "gelu") != "gelu" or cfg.get("position_embedding_type", "absolute") != "absolute":
        raise ConfigError("the packaged BERT uses an activation or position embedding this encoder lacks")
    return {
        "vocab_size": cfg["vocab_size"],
        "d_model": cfg["hidden_size"],
        "num_layers": cfg["num_hidden_layers"],
        "nhead": cfg["num_attention_heads"],
        "dim_feedforward": cfg["intermediate_size"],
        "max_position": cfg["max_position_embeddings"],
        "type_vocab_size": cfg["type_vocab_size"],
        "layer_norm_eps": cfg["layer_norm_eps"],
        "pad_id": cfg["pad_token_id"],
    }


class BertForMLM(nn.Module):
    """BERT encoder + tied MLM head, every self-attention with `attention` (the `model=` config).

    `init="bert"` starts from the packaged BERT checkpoint: its config fixes the sizes (the ones
    given are ignored, post-LN) and its weights are loaded. `max_length` (the data's, if given)
    must fit the positions.
    """

    def __init__(self, attention: AttentionSpec | dict | str, vocab_size: int, pad_id: int = 0,
                 init: str = "random", max_length: int | None = None, d_model: int = 256,
                 num_layers: int = 4, nhead: int = 4, dim_feedforward: int = 1024, max_position: int = 512,
                 dropout: float = 0.1, attn_dropout: float = 0.1, norm_first: bool = False) -> None:
        super().__init__()
        if init not in INITS:
            raise ConfigError(f"task.init={init!r}; use 'random' (train from scratch) or 'bert' (packaged weights)")
        sizes = {"vocab_size": vocab_size, "d_model": d_model, "num_layers": num_layers, "nhead": nhead,
                 "dim_feedforward": dim_feedforward, "max_position": max_position, "pad_id": pad_id}
        if init == "bert":
            arch = bert_architecture()
            if arch["vocab_size"] != vocab_size:
                raise ConfigError(f"the tokenizer has {vocab_size} tokens but the BERT checkpoint {arch['vocab_size']}")
            print(f"[mlm] task.init=bert: {arch['num_layers']} layers, {arch['d_model']} wide, "
                  f"{arch['nhead']} heads, post-LN from the packaged config (task sizes ignored)")
            sizes, norm_first = arch, False
        if max_length is not None and max_length > sizes["max_position"]:
            raise ConfigError(f"task.data.max_length={max_length} exceeds the {sizes['max_position']} positions")
        self.encoder = BertEncoder(**sizes, dropout=dropout, attn_dropout=attn_dropout, spec=attention,
                                   norm_first=norm_first)
        self.head = MLMHead(self.encoder.embeddings.word_embeddings, sizes.get("layer_norm_eps", 1e-12))
        self.apply(_init_bert_weights)
        if init == "bert":
            left = load_bert_weights(self, bert_assets.load_bert_state_dict())
            print(f"[mlm] loaded the packaged BERT weights; left at init: {', '.join(left) or 'none'}")

    def forward(self, input_ids: Tensor, labels: Tensor | None = None,
                padding_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Logits at the masked positions only (labels != -100): (N, vocab), and their labels (N,).

        Projecting only the ~15% masked positions onto the 30k vocabulary saves most of the
        head's memory and time (the full (B, S, V) logits would be ~0.5 GB at batch 32 x 128).
        """
        hidden = self.encoder(input_ids, padding_mask)
        if labels is None:
            return self.head(hidden), labels
        selected = labels != -100
        return self.head(hidden[selected]), labels[selected]


def _init_bert_weights(module: nn.Module) -> None:
    # BERT's initialization: N(0, 0.02) for weights, zero biases, LayerNorm at identity.
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


# --------------------------------------------------------------------------------------------
# BERT checkpoint -> our names
# --------------------------------------------------------------------------------------------

_LAYER_MAP = {
    "attention.self.query": "self_attn.q_proj",
    "attention.self.key": "self_attn.k_proj",
    "attention.self.value": "self_attn.v_proj",
    "attention.output.dense": "self_attn.out_proj",
    "attention.output.LayerNorm": "norm1",
    "intermediate.dense": "linear1",
    "output.dense": "linear2",
    "output.LayerNorm": "norm2",
}
_HEAD_MAP = {
    "cls.predictions.transform.dense": "head.dense",
    "cls.predictions.transform.LayerNorm": "head.norm",
}


def bert_key_to_ours(key: str) -> str | None:
    """HF BERT parameter name -> name in BertForMLM, or None if we have no such parameter."""
    key = key.removeprefix("bert.")
    if key.startswith("embeddings."):
        name = key.replace("embeddings.LayerNorm.", "embeddings.norm.")
        return None if name == "embeddings.position_ids" else "encoder." + name
    if key.startswith("encoder.layer."):
        _, _, index, rest = key.split(".", 3)
        module, _, param = rest.rpartition(".")
        if module in _LAYER_MAP:
            return f"encoder.layers.{index}.{_LAYER_MAP[module]}.{param}"
        return None
    module, _, param = key.rpartition(".")
    if module in _HEAD_MAP:
        return f"{_HEAD_MAP[module]}.{param}"
    if key == "cls.predictions.bias":
        return "head.bias"
    return None  # pooler, NSP head, tied decoder weight


def load_bert_weights(model: BertForMLM, state_dict: dict[str, Tensor]) -> list[str]:
    """Copy a HF BERT state dict into `model`. Returns our parameter names left at their init.

    Every encoder parameter must be covered, except the attention schemes' own parameters (HNAS's
    u, CODA's head MLPs: BERT has none); the MLM head is taken when the checkpoint has one.
    Shapes must match exactly.
    """
    ours = model.state_dict()
    loaded = {}
    for key, value in state_dict.items():
        name = bert_key_to_ours(key)
        if name is None:
            continue
        if name not in ours:
            raise ConfigError(f"checkpoint has {key} but the model has no {name}: layer counts differ")
        if ours[name].shape != value.shape:
            raise ConfigError(
                f"checkpoint {key} has shape {tuple(value.shape)} but the model's {name} has "
                f"{tuple(ours[name].shape)}; with task.init=bert the sizes come from the checkpoint"
            )
        loaded[name] = value
    if "encoder.embeddings.word_embeddings.weight" in loaded:  # the decoder is tied to it
        loaded["head.word_embeddings.weight"] = loaded["encoder.embeddings.word_embeddings.weight"]
    schemes = {n for n, _ in scheme_parameters(model, kind=None)}  # BERT has none of these
    missing = [n for n in ours if n not in loaded and not n.startswith("head.") and n not in schemes]
    if missing:
        raise ConfigError(f"the BERT checkpoint lacks {len(missing)} encoder weights, e.g. {missing[:3]}")
    model.load_state_dict(loaded, strict=False)
    return [n for n in ours if n not in loaded]

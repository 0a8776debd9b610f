"""`task.init=bert`: initialize encoder and decoder from the packaged BERT weights (BERT2BERT).

As in Rothe et al. (2020), "(BERT, BERT)": both stacks start from the same checkpoint. Encoder
layer i and decoder layer i get BERT layer i; a decoder layer's self-attention and feed-forward
take BERT's attention and feed-forward, and its cross-attention (with the LayerNorm after it) has
no BERT counterpart and keeps its random initialization. Both embedding stacks take BERT's
embeddings: word (shared), the first positions, and the LayerNorm; BERT's segment-0 embedding is
folded into the positions, since we have no segments. The packaged checkpoint has no MLM head, so
the LM-head transform stays random (its output projection is the tied word embedding).

Names follow the MLM task's mapping (`tasks.mlm.model.bert_key_to_ours`), translated to ours.
"""

from __future__ import annotations

import torch

from attnlab.errors import ConfigError
from tasks.common.bert_assets import bert_config, load_bert_state_dict
from tasks.common.seq2seq import Seq2SeqTransformer
from tasks.mlm.model import bert_key_to_ours

# Decoder layers: BERT's two LayerNorms sit after self-attention and after the feed-forward.
_DECODER_NORMS = {"norm1": "norm1", "norm2": "norm3"}


def bert_sizes(sizes: dict, max_source_positions: int, max_target_positions: int) -> dict:
    """The model sizes of the packaged checkpoint (they override the configured ones)."""
    config = bert_config()
    limit = config["max_position_embeddings"]
    if max(max_source_positions, max_target_positions) > limit:
        raise ConfigError(
            f"task.init=bert: the checkpoint has {limit} positions but the data asks for "
            f"{max(max_source_positions, max_target_positions)}; lower the datamodule max lengths"
        )
    layers = config["num_hidden_layers"]
    return dict(
        sizes,
        d_model=config["hidden_size"],
        nhead=config["num_attention_heads"],
        dim_feedforward=config["intermediate_size"],
        num_encoder_layers=layers,
        num_decoder_layers=layers,
        dropout=config.get("hidden_dropout_prob", sizes["dropout"]),
    )


def bert_to_headline(
    state_dict: dict[str, torch.Tensor], model: Seq2SeqTransformer
) -> dict[str, torch.Tensor]:
    """Our state-dict entries built from a HF BERT state dict."""
    mlm = {}  # name in the MLM task's BertForMLM -> tensor
    for key, value in state_dict.items():
        name = bert_key_to_ours(key)
        if name is not None:
            mlm[name] = value
    ours: dict[str, torch.Tensor] = {}
    word = mlm["encoder.embeddings.word_embeddings.weight"]
    positions = mlm["encoder.embeddings.position_embeddings.weight"]
    segment0 = mlm["encoder.embeddings.token_type_embeddings.weight"][0]
    for side, embeddings in (
        ("encoder", model.encoder_embeddings),
        ("decoder", model.decoder_embeddings),
    ):
        ours[f"{side}_embeddings.word.weight"] = word
        if embeddings.position is not None:  # none with decoder_positions=none / rope / alibi
            ours[f"{side}_embeddings.position.weight"] = (
                positions[: embeddings.max_positions] + segment0
            )
        ours[f"{side}_embeddings.norm.weight"] = mlm["encoder.embeddings.norm.weight"]
        ours[f"{side}_embeddings.norm.bias"] = mlm["encoder.embeddings.norm.bias"]
    for name, value in mlm.items():
        if not name.startswith("encoder.layers."):
            continue
        _, _, index, rest = name.split(".", 3)  # e.g. "self_attn.q_proj.weight", "norm2.bias"
        ours[f"encoder_layers.{index}.{rest}"] = value
        module, _, param = rest.partition(".")
        rest = f"{_DECODER_NORMS[module]}.{param}" if module in _DECODER_NORMS else rest
        ours[f"decoder_layers.{index}.{rest}"] = value
    return ours


def load_bert_into(model: Seq2SeqTransformer, state_dict: dict | None = None) -> list[str]:
    """Copy BERT weights into `model`; returns the parameter names left at their random init."""
    if state_dict is None:
        state_dict = load_bert_state_dict()
    own = model.state_dict()
    loaded = {}
    for name, value in bert_to_headline(state_dict, model).items():
        if name not in own:  # a deeper checkpoint than the model: its extra layers are unused
            continue
        if own[name].shape != value.shape:
            raise ConfigError(
                f"BERT weight for {name} has shape {tuple(value.shape)}, the model's "
                f"{tuple(own[name].shape)}; with task.init=bert the sizes come from the checkpoint"
            )
        loaded[name] = value.to(own[name].dtype)
    model.load_state_dict(loaded, strict=False)
    return [name for name, _ in model.named_parameters() if name not in loaded]

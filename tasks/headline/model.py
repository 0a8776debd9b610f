"""Encoder-decoder Transformer for headline generation.

- One WordPiece vocabulary: the encoder input embeddings, decoder input embeddings and output
  projection share one matrix (as BERT ties its MLM output to its input embeddings).
- BERT-style embeddings on both sides (word + learned position + LayerNorm), post-LN layers as
  BERT (`norm_first=False`, which `init=bert` needs) or pre-LN (`norm_first=True`, with a final
  LayerNorm per stack: trains stably at higher learning rates from scratch), and BERT's LM-head
  transform before the tied output, so that `init=bert` can load all of them
  (see `tasks.headline.bert_init`).
- The encoder layers use the `model=` attention spec; the decoder's self- and cross-attention use
  `spec.for_decoder(decoder_attention)`: the same scheme where it normalizes over keys (unas,
  entmax, coda, realformer), else `decoder_attention` (UNAS): a query-normalized scheme would
  leak the future (the library refuses it with ConfigError).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.attention import TransformerDecoderLayer, TransformerEncoderLayer, run_stack
from attnlab.attention.spec import AttentionSpec
from attnlab.errors import ConfigError
from tasks.common.incremental import (
    DecoderCache,
    PrefixCache,
    cacheable,
    decoder_layer_step,
    start_cache,
)

_ACTIVATIONS = {"gelu": nn.GELU, "relu": nn.ReLU}


class Embeddings(nn.Module):
    """word (shared) + learned position, then LayerNorm and dropout, as in BERT."""

    def __init__(
        self, word: nn.Embedding, max_positions: int, d_model: int, dropout: float, eps: float
    ):
        super().__init__()
        self.word = word
        self.position = nn.Embedding(max_positions, d_model)
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.dropout = nn.Dropout(dropout)

    @property
    def max_positions(self) -> int:
        return self.position.num_embeddings

    def forward(self, ids: Tensor) -> Tensor:
        length = ids.shape[1]
        if length > self.max_positions:
            raise ConfigError(
                f"sequence of {length} tokens is longer than the {self.max_positions} positions "
                f"of the model; truncate it (datamodule max lengths) or raise the model's positions"
            )
        positions = torch.arange(length, device=ids.device)
        return self.dropout(self.norm(self.word(ids) + self.position(positions)[None]))


class HeadlineTransformer(nn.Module):
    def __init__(
        self,
        vocab_size: int,
        pad_id: int,
        attention: AttentionSpec | dict | str = "unas",
        decoder_attention: AttentionSpec | dict | str = "unas",
        d_model: int = 128,
        nhead: int = 4,
        num_encoder_layers: int = 2,
        num_decoder_layers: int = 2,
        dim_feedforward: int = 512,
        dropout: float = 0.1,
        attention_dropout: float | None = None,
        activation: str = "gelu",
        max_source_positions: int = 128,
        max_target_positions: int = 64,
        layer_norm_eps: float = 1e-12,
        norm_first: bool = False,
        output_vocab_size: int | None = None,
    ) -> None:
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ConfigError(f"activation={activation!r}; use one of {', '.join(_ACTIVATIONS)}")
        encoder_spec = AttentionSpec.from_config(attention)
        decoder_spec = encoder_spec.for_decoder(decoder_attention)  # coda/realformer: decoder too
        if decoder_spec.normalizes_over_queries:
            raise ConfigError(
                f"decoder attention {decoder_spec.scheme!r} normalizes over queries, which mixes "
                f"all target positions and leaks the future into step-by-step decoding. The "
                f"headline decoder must normalize over keys: remove task.module.decoder_attention "
                f"(or set it to unas); model={encoder_spec.scheme} applies to the encoder only"
            )
        self.pad_id = pad_id
        self.d_model = d_model
        self.max_source_positions = max_source_positions
        self.max_target_positions = max_target_positions

        word = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        self.encoder_embeddings = Embeddings(
            word, max_source_positions, d_model, dropout, layer_norm_eps
        )
        self.decoder_embeddings = Embeddings(
            word, max_target_positions, d_model, dropout, layer_norm_eps
        )
        layer_args = {
            "d_model": d_model,
            "nhead": nhead,
            "dim_feedforward": dim_feedforward,
            "dropout": dropout,
            # None: same as dropout. With dropout on attention weights, DNAS/HNAS materialize S x S.
            "attn_dropout": attention_dropout,
            "activation": activation,
            "norm_first": norm_first,
            "layer_norm_eps": layer_norm_eps,
        }
        self.encoder_layers = nn.ModuleList(
            TransformerEncoderLayer(spec=encoder_spec, layer_index=i, **layer_args)
            for i in range(num_encoder_layers)
        )
        self.decoder_layers = nn.ModuleList(
            TransformerDecoderLayer(spec=decoder_spec, layer_index=i, **layer_args)
            for i in range(num_decoder_layers)
        )
        # Pre-LN stacks end with a LayerNorm (their residual stream is never normalized otherwise).
        self.encoder_norm = nn.LayerNorm(d_model, eps=layer_norm_eps) if norm_first else nn.Identity()
        self.decoder_norm = nn.LayerNorm(d_model, eps=layer_norm_eps) if norm_first else nn.Identity()
        # BERT's LM head: dense + activation + LayerNorm, then the tied output projection + bias.
        self.head_transform = nn.Sequential(
            nn.Linear(d_model, d_model),
            _ACTIVATIONS[activation](),
            nn.LayerNorm(d_model, eps=layer_norm_eps),
        )
        self.output_bias = nn.Parameter(torch.zeros(vocab_size))
        # The output vocabulary: the token ids the decoder can produce (all by default; the task
        # restricts it to the tokens of the training headlines, see `set_output_vocab`).
        self.vocab_size = vocab_size
        size = vocab_size if output_vocab_size is None else int(output_vocab_size)
        self.register_buffer("output_ids", torch.arange(size))
        self.apply(_init_bert_style)

    def set_output_vocab(self, token_ids) -> None:
        """Let the decoder produce only these token ids (sorted, unique; [PAD], [UNK] and the
        end token should be among them).

        Projecting onto the ~9k word pieces that occur in Debian headlines instead of all 30,522
        makes the output layer, which costs most of a small model's training step, ~3x cheaper.
        """
        ids = torch.as_tensor(sorted({int(t) for t in token_ids}), dtype=torch.long)
        if ids.numel() == 0 or ids[0] < 0 or ids[-1] >= self.vocab_size:
            raise ConfigError(f"output vocabulary ids must lie in [0, {self.vocab_size})")
        self.output_ids = ids.to(self.output_ids.device)

    @property
    def restricted_output(self) -> bool:
        return self.output_ids.numel() < self.vocab_size

    def output_index(self, token_ids: Tensor, unknown_id: int) -> Tensor:
        """Positions of token ids in the output vocabulary; ids outside it map to `unknown_id`'s."""
        if not self.restricted_output:
            return token_ids
        lookup = torch.full((self.vocab_size,), -1, dtype=torch.long, device=token_ids.device)
        lookup[self.output_ids] = torch.arange(self.output_ids.numel(), device=token_ids.device)
        index = lookup[token_ids]
        return torch.where(index < 0, lookup[unknown_id], index)

    @property
    def word_embeddings(self) -> nn.Embedding:
        return self.encoder_embeddings.word

    def encode(self, src_ids: Tensor, src_padding_mask: Tensor | None = None) -> Tensor:
        x = self.encoder_embeddings(src_ids)
        return self.encoder_norm(run_stack(self.encoder_layers, x, src_padding_mask))

    def decode(
        self,
        tgt_ids: Tensor,
        memory: Tensor,
        memory_padding_mask: Tensor | None = None,
        tgt_padding_mask: Tensor | None = None,
    ) -> Tensor:
        """Logits (B, T, V) of the token after each prefix position (causal)."""
        return self.project(
            self.decode_hidden(tgt_ids, memory, memory_padding_mask, tgt_padding_mask)
        )

    def output_logits(self, hidden: Tensor) -> Tensor:
        """Decoder states (..., D) -> logits over the output vocabulary (..., len(output_ids)):
        LM-head transform + the tied word embeddings of those tokens."""
        h = self.head_transform(hidden)
        if not self.restricted_output:
            return h @ self.word_embeddings.weight.t() + self.output_bias
        weight = self.word_embeddings.weight.index_select(0, self.output_ids)
        return h @ weight.t() + self.output_bias.index_select(0, self.output_ids)

    def project(self, hidden: Tensor) -> Tensor:
        """Decoder states (..., D) -> logits over all token ids (..., V); -inf outside the output
        vocabulary (so decoding never produces those tokens)."""
        logits = self.output_logits(hidden)
        if not self.restricted_output:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.vocab_size), float("-inf"))
        return full.index_copy(-1, self.output_ids, logits)

    def decode_hidden(
        self,
        tgt_ids: Tensor,
        memory: Tensor,
        memory_padding_mask: Tensor | None = None,
        tgt_padding_mask: Tensor | None = None,
    ) -> Tensor:
        """Decoder states (B, T, D), before the LM head."""
        y = self.decoder_embeddings(tgt_ids)
        y = run_stack(self.decoder_layers, y, memory, tgt_key_padding_mask=tgt_padding_mask,
                      memory_key_padding_mask=memory_padding_mask)
        return self.decoder_norm(y)

    def start_decoding(
        self, memory: Tensor, memory_padding_mask: Tensor | None = None
    ) -> DecoderCache | PrefixCache:
        """A key/value cache for `decode_step` (cross-attention keys/values projected once); a
        prefix store for decoders whose attention cannot be cached (cascades: CODA, RealFormer)."""
        if cacheable(list(self.decoder_layers)):
            return start_cache(list(self.decoder_layers), memory, memory_padding_mask)
        return PrefixCache(memory, memory_padding_mask)

    def decode_step(self, token_ids: Tensor, cache: DecoderCache | PrefixCache) -> Tensor:
        """Decoder state (B, D) after feeding token_ids (B,) at the next position (eval only).

        Equals `decode_hidden(prefix, ...)[:, -1]` for the prefix fed so far (tested).
        """
        position = cache.length
        if position >= self.max_target_positions:
            raise ConfigError(
                f"decoding past the {self.max_target_positions} decoder positions; lower the "
                f"decoding max length"
            )
        if isinstance(cache, PrefixCache):
            prefix = cache.append(token_ids)
            cache.length += 1
            return self.decode_hidden(prefix, cache.memory, cache.memory_padding_mask)[:, -1]
        emb = self.decoder_embeddings
        y = emb.word(token_ids) + emb.position.weight[position]
        y = emb.dropout(emb.norm(y))[:, None]
        for index, layer in enumerate(self.decoder_layers):
            y = decoder_layer_step(layer, y, cache, index)
        cache.length += 1
        return self.decoder_norm(y[:, 0])

    def forward(self, src_ids: Tensor, tgt_ids: Tensor) -> Tensor:
        """Teacher-forced logits (B, T, V) of the token after each position of tgt_ids."""
        return self.project(self.forward_hidden(src_ids, tgt_ids))

    def forward_hidden(self, src_ids: Tensor, tgt_ids: Tensor) -> Tensor:
        src_mask = src_ids.eq(self.pad_id)
        memory = self.encode(src_ids, src_mask)
        return self.decode_hidden(tgt_ids, memory, src_mask, tgt_ids.eq(self.pad_id))


def _init_bert_style(module: nn.Module) -> None:
    """Normal(0, 0.02) weights, zero biases, unit LayerNorm (BERT's initializer_range)."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, std=0.02)
        if module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)

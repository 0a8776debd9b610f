"""The Transformer encoder-decoder of the sequence-to-sequence tasks (headline, mt).

Built from the library's layers (`TransformerEncoderLayer` / `TransformerDecoderLayer` with
`layer_index=i`, run by `run_stack`), so every scheme and every analysis works in it:

- The encoder layers use the `model=` attention spec; the decoder's self- and cross-attention use
  `spec.for_decoder(decoder_attention)`: the same scheme where it normalizes over keys (unas,
  entmax) or is a logit transform (coda, realformer: every stack, as in their papers, the decoder
  copy normalizing with UNAS), else `decoder_attention` (UNAS). A query-normalized decoder
  attention would leak the future: refused with a ConfigError.
- One vocabulary: the encoder and decoder input embeddings and the output projection share one
  matrix (BERT ties its MLM output to its input; fairseq's `--share-all-embeddings`).

What differs between the tasks is an option:

| option | headline (BERT style) | mt (fairseq `transformer_iwslt_de_en`) |
|---|---|---|
| `positions` | `learned`: word + learned position, LayerNorm, dropout | `sinusoidal`: sqrt(d) x word + sinusoids, dropout |
| `decoder_positions` | null: as `positions`; or `none` / `rope` / `alibi` | the same |
| `lm_head` | true: BERT's dense + activation + LayerNorm before the tied projection, plus a bias | false: the tied projection alone |
| `weight_init` | `bert`: Normal(0, 0.02) everywhere | `fairseq`: Xavier-uniform linears, Normal(0, d^-1/2) embeddings |
| `norm_first` | post-LN (BERT; pre-LN option) | post-LN (fairseq's default; pre-LN option) |
| `output_vocab` / `set_output_vocab` | the tokens of the training headlines | the whole joint BPE |

`decoder_positions` (none | rope | alibi) moves the decoder's positions into its self-attention
(`attnlab.attention.positions`; `none`: causal attention alone tells them apart): its embedding
keeps the style of `positions` (LayerNorm, or the sqrt(d) scale) without a position term, and
cross-attention has none (as `TransformerDecoderLayer(positions=...)`). The encoder keeps
`positions`: ALiBi is causal, and a position-free encoder sees a bag of tokens.

Incremental decoding (`start_decoding` / `decode_step`, on the library's KV caches and layer
steps, `attnlab.attention.kv_cache`) and search (`tasks.common.decoding`) work on any of them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from attnlab.attention import (
    DecoderCache,
    MultiHeadAttention,
    PrefixCache,
    TransformerDecoderLayer,
    TransformerEncoderLayer,
    cacheable,
    run_stack,
    step_stack,
)
from attnlab.attention.layers import make_activation
from attnlab.attention.spec import AttentionSpec
from attnlab.errors import ConfigError

POSITIONS = ("learned", "sinusoidal")  # the embeddings' (both stacks' by default)
INSIDE_ATTENTION = ("none", "rope", "alibi")  # the decoder's self-attention's instead
WEIGHT_INITS = ("bert", "fairseq")


def sinusoids(length: int, dim: int) -> Tensor:
    """(length, dim) fixed position encodings as fairseq builds them: sines of the first half of
    the frequencies, then their cosines (Vaswani et al. 2017, concatenated, not interleaved)."""
    half = dim // 2
    freq = torch.exp(torch.arange(half, dtype=torch.float32) * -(math.log(10000.0) / max(half - 1, 1)))
    angles = torch.arange(length, dtype=torch.float32)[:, None] * freq[None]
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
    return torch.nn.functional.pad(table, (0, dim - 2 * half))  # odd dim: a zero column


class Embeddings(nn.Module):
    """Word embedding (shared) + positions.

    positions="learned" (BERT): word + learned position, then LayerNorm and dropout.
    positions="sinusoidal" (fairseq): sqrt(d) x word + fixed sinusoids, then dropout.
    table=False (positions inside the attention): the same style without the position term.
    """

    def __init__(self, word: nn.Embedding, max_positions: int, d_model: int, dropout: float,
                 eps: float, positions: str = "learned", table: bool = True):
        super().__init__()
        self.word = word
        self._max_positions = int(max_positions)
        learned = positions == "learned"
        self.position = nn.Embedding(max_positions, d_model) if learned and table else None
        fixed = sinusoids(max_positions, d_model) if not learned and table else None
        self.register_buffer("sinusoids", fixed, persistent=False)  # rebuilt from the sizes
        self.norm = nn.LayerNorm(d_model, eps=eps) if learned else nn.Identity()
        self.scale = None if learned else math.sqrt(d_model)
        self.dropout = nn.Dropout(dropout)

    @property
    def max_positions(self) -> int:
        return self._max_positions

    def forward(self, ids: Tensor, start: int = 0) -> Tensor:
        """ids (B, T) at positions start .. start + T - 1 -> (B, T, D)."""
        end = start + ids.shape[1]
        if end > self.max_positions:
            raise ConfigError(
                f"sequence of {end} tokens is longer than the {self.max_positions} positions "
                f"of the model; truncate it (datamodule max lengths) or raise the model's positions"
            )
        x = self.word(ids) if self.scale is None else self.word(ids) * self.scale
        if self.position is not None:
            x = x + self.position(torch.arange(start, end, device=ids.device))[None]
        elif self.sinusoids is not None:
            x = x + self.sinusoids[start:end][None]
        return self.dropout(self.norm(x))


class Seq2SeqTransformer(nn.Module):
    # what `compile=true` compiles besides forward: the tasks' teacher forcing (target_logits)
    # runs it (attnlab.compiling)
    compile_methods = ("forward_hidden",)

    def __init__(
        self,
        vocab_size: int,
        pad_id: int,
        attention: AttentionSpec | dict | str,
        *,
        # the defaults are what conf/task/headline.yaml and conf/task/mt.yaml both give; where
        # they differ (headline: BERT's layers, mt: fairseq's) there is none
        decoder_attention: AttentionSpec | dict | str = "unas",
        d_model: int,
        nhead: int = 4,
        num_encoder_layers: int,
        num_decoder_layers: int,
        dim_feedforward: int = 512,
        dropout: float = 0.1,
        attention_dropout: float | None = 0.0,
        activation: str,
        max_source_positions: int = 128,
        max_target_positions: int = 64,
        layer_norm_eps: float,
        norm_first: bool = False,
        output_vocab: Sequence[int] | None = None,
        positions: str,
        decoder_positions: str | None = None,
        lm_head: bool,
        weight_init: str,
    ) -> None:
        super().__init__()
        make_activation(activation)  # an unknown name fails here, before anything is built
        if positions not in POSITIONS:
            hint = (f"; positions inside attention ({', '.join(INSIDE_ATTENTION)}) are the "
                    f"decoder's: task.module.net.decoder_positions={positions}"
                    if positions in INSIDE_ATTENTION else "")
            raise ConfigError(f"task.module.net.positions={positions!r}; use one of "
                              f"{', '.join(POSITIONS)}{hint}")
        decoder_positions = decoder_positions or positions
        if decoder_positions not in POSITIONS + INSIDE_ATTENTION:
            raise ConfigError(f"task.module.net.decoder_positions={decoder_positions!r}; use one "
                              f"of {', '.join(POSITIONS + INSIDE_ATTENTION)} (or null: as positions)")
        if decoder_positions in POSITIONS and decoder_positions != positions:
            raise ConfigError(f"task.module.net.decoder_positions={decoder_positions} differs from "
                              f"positions={positions}: both stacks share one embedding style; use "
                              f"null, or {', '.join(INSIDE_ATTENTION)}")
        if weight_init not in WEIGHT_INITS:
            raise ConfigError(f"weight_init={weight_init!r}; use one of {', '.join(WEIGHT_INITS)}")
        encoder_spec = AttentionSpec.from_config(attention)
        decoder_spec = encoder_spec.for_decoder(decoder_attention)  # coda/realformer: decoder too
        if decoder_spec.normalizes_over_queries:
            raise ConfigError(
                f"decoder attention {decoder_spec.scheme!r} normalizes over queries, which mixes "
                f"all target positions and leaks the future into step-by-step decoding. The "
                f"decoder must normalize over keys: remove task.module.net.decoder_attention "
                f"(or set it to unas); model={encoder_spec.scheme} applies to the encoder only"
            )
        self.pad_id = pad_id
        self.d_model = d_model
        self.max_source_positions = max_source_positions
        self.max_target_positions = max_target_positions
        self.decoder_positions = decoder_positions

        # Built in this order (the seeded initialization draws in module order).
        word = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        self.encoder_embeddings = Embeddings(
            word, max_source_positions, d_model, dropout, layer_norm_eps, positions
        )
        self.decoder_embeddings = Embeddings(
            word, max_target_positions, d_model, dropout, layer_norm_eps, positions,
            table=decoder_positions in POSITIONS,
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
        inside = decoder_positions if decoder_positions in ("rope", "alibi") else "none"
        self.decoder_layers = nn.ModuleList(
            TransformerDecoderLayer(spec=decoder_spec, layer_index=i, positions=inside, **layer_args)
            for i in range(num_decoder_layers)
        )
        # Pre-LN stacks end with a LayerNorm (their residual stream is never normalized otherwise).
        self.encoder_norm = nn.LayerNorm(d_model, eps=layer_norm_eps) if norm_first else nn.Identity()
        self.decoder_norm = nn.LayerNorm(d_model, eps=layer_norm_eps) if norm_first else nn.Identity()
        if lm_head:
            # BERT's LM head: dense + activation + LayerNorm, then the tied output projection + bias.
            self.head_transform = nn.Sequential(
                nn.Linear(d_model, d_model),
                make_activation(activation),
                nn.LayerNorm(d_model, eps=layer_norm_eps),
            )
            self.output_bias = nn.Parameter(torch.zeros(vocab_size))
        else:  # fairseq: the decoder states times the tied embeddings, no bias
            self.head_transform = nn.Identity()
            self.register_parameter("output_bias", None)
        # The output vocabulary: the token ids the decoder can produce (all by default; headline
        # restricts it to the tokens of the training headlines, see `set_output_vocab`).
        self.vocab_size = vocab_size
        self.register_buffer("output_ids", torch.arange(vocab_size))
        if weight_init == "bert":
            self.apply(_init_bert_style)
        else:
            _init_fairseq_style(self)
        if output_vocab is not None:  # a buffer: a checkpoint's ids load into it
            self.set_output_vocab(output_vocab)

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

    def output_index(self, token_ids: Tensor, unknown_id: int | None = None) -> Tensor:
        """Positions of token ids in the output vocabulary; ids outside it map to `unknown_id`'s."""
        if not self.restricted_output:
            return token_ids
        if unknown_id is None:
            raise ValueError("a restricted output vocabulary needs the unknown token's id")
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
        the LM-head transform (if any) + the tied word embeddings of those tokens (+ bias)."""
        h = self.head_transform(hidden)
        if not self.restricted_output:
            logits = h @ self.word_embeddings.weight.t()
            return logits if self.output_bias is None else logits + self.output_bias
        weight = self.word_embeddings.weight.index_select(0, self.output_ids)
        logits = h @ weight.t()
        if self.output_bias is None:
            return logits
        return logits + self.output_bias.index_select(0, self.output_ids)

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
        """Decoder states (B, T, D), before the output projection."""
        y = self.decoder_embeddings(tgt_ids)
        y = run_stack(self.decoder_layers, y, memory, tgt_key_padding_mask=tgt_padding_mask,
                      memory_key_padding_mask=memory_padding_mask)
        return self.decoder_norm(y)

    def start_decoding(
        self, memory: Tensor, memory_padding_mask: Tensor | None = None
    ) -> DecoderCache | PrefixCache:
        """A key/value cache for `decode_step` (cross-attention keys/values projected once; the
        row-wise cascades of CODA and RealFormer are carried step by step); a prefix store for
        decoders whose attention cannot be cached."""
        if cacheable(self.decoder_layers, cascades=True):
            return DecoderCache.start(self.decoder_layers, memory, memory_padding_mask)
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
            return self.decode_hidden(prefix, cache.memory, cache.memory_padding_mask)[:, -1]
        y = self.decoder_embeddings(token_ids[:, None], start=position)
        return self.decoder_norm(step_stack(self.decoder_layers, y, cache)[:, 0])

    def forward(self, src_ids: Tensor, tgt_ids: Tensor) -> Tensor:
        """Teacher-forced logits (B, T, V) of the token after each position of tgt_ids."""
        return self.project(self.forward_hidden(src_ids, tgt_ids))

    def forward_hidden(self, src_ids: Tensor, tgt_ids: Tensor) -> Tensor:
        src_mask = src_ids.eq(self.pad_id)
        memory = self.encode(src_ids, src_mask)
        return self.decode_hidden(tgt_ids, memory, src_mask, tgt_ids.eq(self.pad_id))

    def target_logits(
        self, src_ids: Tensor, tgt_ids: Tensor, unknown_id: int | None = None
    ) -> tuple[Tensor, Tensor]:
        """Teacher forcing on tgt_ids (B, T) (start token first): logits (N, C) over the output
        vocabulary at the N non-padding target positions, and their labels (N,) as positions in
        it (a token outside a restricted output vocabulary counts as `unknown_id`).

        Only the real target positions (most are padding) are projected onto the vocabulary."""
        hidden = self.forward_hidden(src_ids, tgt_ids[:, :-1])
        targets = tgt_ids[:, 1:]
        real = targets.ne(self.pad_id)
        return self.output_logits(hidden[real]), self.output_index(targets[real], unknown_id)


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


def _init_fairseq_style(model: Seq2SeqTransformer) -> None:
    """fairseq's Transformer initialization: Xavier-uniform linears with zero biases (gain
    1/sqrt(2) for the query/key/value projections, as its MultiheadAttention), the embedding
    Normal(0, d^-1/2) with a zero padding row. Modules of a scheme (CODA's head MLP) keep the
    initialization their scheme gives them."""
    owned = {id(m) for a in model.modules() if isinstance(a, MultiHeadAttention)
             and a.transform is not None for m in a.transform.modules()}
    for module in model.modules():
        if isinstance(module, nn.Linear) and id(module) not in owned:
            nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
    for attn in model.modules():
        if isinstance(attn, MultiHeadAttention):
            for proj in (attn.q_proj, attn.k_proj, getattr(attn, "v_proj", None)):
                if proj is not None:
                    nn.init.xavier_uniform_(proj.weight, gain=1 / math.sqrt(2))
    word = model.word_embeddings
    nn.init.normal_(word.weight, std=model.d_model ** -0.5)
    with torch.no_grad():
        word.weight[model.pad_id].zero_()

"""`encoder=pretrained`: the packaged 6-layer BERT (MiniLM-L6-H384, bert-base-uncased vocabulary;
tasks.common.bert_assets) with the scheme of `model=` in every self-attention, fine-tuned.

The scheme runs through transformers' attention interface (`attnlab.hf.use_scheme`): the real
weights are loaded as transformers loads them, then every self-attention runs attnlab's kernels,
HNAS's u per layer and head trained with the rest and seen by every analysis. The classify
sequences carry no [CLS]/[SEP] (tasks.classify.tokenization); BERT was pretrained with them, so
they are added around each sentence here and their states dropped, so the hops see one state per
token, as with the other encoders.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.attention import AttentionSpec
from attnlab.errors import ConfigError
from attnlab.hf import SchemeAttention, use_scheme
from tasks.common import bert_assets


def load_pretrained_bert(spec: AttentionSpec | str | None = None, layers: int | None = None):
    """The packaged BertModel (no pooler), its first `layers` layers (None: all 6), with `spec`'s
    scheme in every self-attention (None: transformers' own attention, as pretrained)."""
    from transformers import BertModel
    from transformers.utils import logging as hf_logging

    total = int(bert_assets.bert_config()["num_hidden_layers"])
    if layers is not None and not 1 <= int(layers) <= total:
        raise ConfigError(f"task.module.net.pretrained_layers={layers}: the packaged BERT has "
                          f"{total} layers; give 1..{total}, or null for all of them")
    extra = {} if layers is None else {"num_hidden_layers": int(layers)}
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # dropped layers and the pooler are "unused weights" to it
    hf_logging.disable_progress_bar()
    try:
        bert = BertModel.from_pretrained(str(bert_assets.bert_dir()), add_pooling_layer=False,
                                         attn_implementation="eager", **extra)
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()
    return bert if spec is None else use_scheme(bert, AttentionSpec.from_config(spec))


def with_special_tokens(ids: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
    """[CLS] ids [SEP] (B, S + 2) and its attention mask (1 = token), [SEP] after each sentence's
    last token."""
    b, s = ids.shape
    out = torch.full((b, s + 2), bert_assets.PAD_ID, dtype=ids.dtype, device=ids.device)
    out[:, 0] = bert_assets.CLS_ID
    out[:, 1:s + 1] = ids
    rows = torch.arange(b, device=ids.device)
    out[rows, lengths.to(ids.device) + 1] = bert_assets.SEP_ID
    mask = torch.arange(s + 2, device=ids.device)[None] <= (lengths.to(ids.device) + 1)[:, None]
    return out, mask.long()


class PretrainedEncoder(nn.Module):
    """The packaged BERT as the sentence encoder: token states (B, S, 384)."""

    def __init__(self, spec: AttentionSpec, vocab_size: int, layers: int | None = None) -> None:
        super().__init__()
        expected = int(bert_assets.bert_config()["vocab_size"])
        if int(vocab_size) != expected:
            raise ConfigError(f"task.encoder=pretrained needs the packaged WordPiece vocabulary "
                              f"({expected} tokens) but the data give {vocab_size}; use "
                              f"task.data.tokenizer=wordpiece")
        # from_pretrained returns eval mode, and Lightning keeps submodules' modes: BERT's
        # dropout (its config's) must be on while fine-tuning, as in any other module
        self.bert = load_pretrained_bert(spec, layers).train()
        self.output_dim = int(self.bert.config.hidden_size)

    def pretrained_parameters(self) -> list[nn.Parameter]:
        """BERT's own weights (not the scheme's parameters, e.g. HNAS's u)."""
        own = {id(p) for m in self.bert.modules() if isinstance(m, SchemeAttention)
               for p in m.parameters()}
        return [p for p in self.bert.parameters() if id(p) not in own]

    def forward(self, ids: Tensor, padding_mask: Tensor, lengths: Tensor) -> Tensor:
        full, mask = with_special_tokens(ids, lengths)
        states = self.bert(input_ids=full, attention_mask=mask).last_hidden_state
        return states[:, 1:ids.shape[1] + 1]

"""The headline network: the shared encoder-decoder in BERT's style, random or from BERT.

    task.module.net:
      _target_: tasks.headline.network.HeadlineTransformer
      init: random          # or bert: both stacks from the packaged BERT weights (BERT2BERT)
      d_model: 128 ...      # every other option is tasks.common.seq2seq.Seq2SeqTransformer's

With `init=bert` the checkpoint fixes the architecture: its sizes and BERT's post-LN layers
replace the configured ones (`tasks.headline.bert_init`).
"""

from __future__ import annotations

import inspect

from attnlab.errors import ConfigError
from tasks.common.seq2seq import Seq2SeqTransformer

INITS = ("random", "bert")


class HeadlineTransformer(Seq2SeqTransformer):
    def __init__(self, *args, init: str = "random", **kwargs) -> None:
        if init not in INITS:
            raise ConfigError(f"task.init={init!r}; use one of {', '.join(INITS)}")
        if init == "bert":
            from tasks.headline.bert_init import bert_sizes

            options = inspect.signature(Seq2SeqTransformer).bind(*args, **kwargs)
            options.apply_defaults()
            args, kwargs = (), dict(options.arguments, norm_first=False)
            kwargs = bert_sizes(kwargs, kwargs["max_source_positions"], kwargs["max_target_positions"])
        super().__init__(*args, **kwargs)
        if init == "bert":
            from tasks.headline.bert_init import load_bert_into

            load_bert_into(self)

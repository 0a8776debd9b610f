"""Sources, peaked models and the beam = greedy check shared by the seq2seq and mt tests."""

from __future__ import annotations

import torch

from tasks.common.decoding import beam_search, greedy_decode, strip_generated

PAD, BOS, EOS = 0, 1, 2
# the layer choices of each task's network, which Seq2SeqTransformer takes no default for (each
# task's YAML is their home): conf/task/headline.yaml's (BERT's) and conf/task/mt.yaml's (fairseq's)
BERT_STYLE = {"activation": "gelu", "layer_norm_eps": 1e-12, "positions": "learned",
              "lm_head": True, "weight_init": "bert"}
FAIRSEQ_STYLE = {"activation": "relu", "layer_norm_eps": 1e-5, "positions": "sinusoidal",
                 "lm_head": False, "weight_init": "fairseq"}


def padded_sources(lengths, vocab, seed=1):
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(3, vocab, (len(lengths), max(lengths)), generator=gen)
    for row, length in enumerate(lengths):
        src[row, length:] = PAD
    return src, src.eq(PAD)


def peaked(model, scale=10.0, eos_bias=0.5):
    """Weights of std `scale` x the initial ones give peaked next-token distributions, and a nudge
    to EOS makes some rows finish early while others run to the max length."""
    with torch.no_grad():
        for weight in model.parameters():
            if weight.dim() > 1:
                weight.mul_(scale)
        if model.output_bias is not None:
            model.output_bias[EOS] = eos_bias
        else:  # no output bias (fairseq style): EOS's tied embedding row gets larger
            model.word_embeddings.weight[EOS] *= 1 + eos_bias
    return model


def assert_beam_one_is_greedy(model, src, mask, max_length=10, **kwargs):
    greedy = greedy_decode(model, src, mask, bos_id=BOS, eos_id=EOS, pad_id=PAD, max_length=max_length, **kwargs)
    lengths = [len(r) for r in strip_generated(greedy, EOS, PAD)]
    assert min(lengths) < max_length and max(lengths) == max_length, lengths  # both kinds of rows
    for alpha in (0.0, 0.6, 2.0):
        beam = beam_search(model, src, mask, bos_id=BOS, eos_id=EOS, pad_id=PAD, max_length=max_length,
                           beam_size=1, length_penalty=alpha, **kwargs)
        assert torch.equal(beam, greedy)

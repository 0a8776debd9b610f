"""The shared encoder-decoder (tasks.common.seq2seq) in both of its styles (headline's BERT style,
mt's fairseq style): schemes per stack and the decoder guard, the cached decoder step (cascades
included) against the full decoder, greedy vs beam search, exact search, the output vocabulary,
positions and initialization."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from helpers.seq2seq_cases import (
    BERT_STYLE,
    BOS,
    EOS,
    FAIRSEQ_STYLE,
    PAD,
    assert_beam_one_is_greedy,
    padded_sources,
    peaked,
)

from attnlab.attention import DecoderCache, PrefixCache
from attnlab.errors import ConfigError
from tasks.common.decoding import (
    beam_search,
    greedy_decode,
    length_penalty_factor,
)
from tasks.common.seq2seq import Seq2SeqTransformer, sinusoids

# what the tasks pass (the net nodes of conf/task/headline.yaml and conf/task/mt.yaml)
STYLES = {"headline": BERT_STYLE, "mt": FAIRSEQ_STYLE}


def tiny_model(vocab=40, attention="hnas", seed=0, style="headline", **kwargs):
    torch.manual_seed(seed)
    args = {
        "d_model": 32,
        "nhead": 4,
        "num_encoder_layers": 2,
        "num_decoder_layers": 2,
        "dim_feedforward": 64,
        "dropout": 0.0,
        "max_source_positions": 16,
        "max_target_positions": 12,
        **STYLES[style],
    }
    args.update(kwargs)
    return Seq2SeqTransformer(vocab, PAD, attention=attention, **args).eval()


@pytest.mark.parametrize("scheme", ["dnas", "hnas", "sinkhorn"])
def test_query_normalized_decoder_attention_is_refused(scheme):
    with pytest.raises(ConfigError, match="decoder"):
        tiny_model(attention="unas", decoder_attention=scheme)


def _schemes(model):
    enc = {(layer.self_attn.scheme, layer.self_attn.spec.normalization) for layer in model.encoder_layers}
    dec = {(m.scheme, m.spec.normalization) for layer in model.decoder_layers
           for m in (layer.self_attn, layer.cross_attn)}
    return enc, dec


def test_schemes_apply_per_stack():
    # query-normalized schemes: encoder only; transforms and entmax: every stack (their decoder
    # copies normalize with UNAS)
    assert _schemes(tiny_model(attention="dnas")) == ({("dnas", "dnas")}, {("unas", "unas")})
    assert _schemes(tiny_model(attention="coda")) == ({("coda", "unas")}, {("coda", "unas")})
    cascaded_dnas = tiny_model(attention={"scheme": "realformer", "normalization": "dnas"}, style="mt")
    assert _schemes(cascaded_dnas) == ({("realformer", "dnas")}, {("realformer", "unas")})
    assert _schemes(tiny_model(attention={"scheme": "entmax"}, style="mt")) == (
        {("entmax", "entmax")}, {("entmax", "entmax")})
    assert _schemes(tiny_model(attention={"scheme": "coda", "decoder": False})) == (
        {("coda", "unas")}, {("unas", "unas")})


@pytest.mark.parametrize("style, norm_first, scheme, decoder_positions", [
    ("headline", False, "hnas", None), ("headline", True, "hnas", None), ("mt", False, "coda", None),
    ("mt", True, "realformer", None), ("mt", False, "entmax", None),
    ("mt", False, "unas", "rope"), ("headline", False, "sink", "alibi"), ("mt", True, "coda", "alibi"),
    ("headline", False, "unas", "none"),
])
def test_cached_decode_step_equals_the_full_decoder(one_thread, style, norm_first, scheme,
                                                    decoder_positions):
    # The key/value cache must give, at every position, the state of the full teacher-forced
    # decoder on the prefix; also after reordering rows as beam search does. Cascades (CODA,
    # RealFormer) carry the newest position's row of logits from layer to layer. Positions inside
    # the decoder's self-attention (rope, alibi) act on each step at the cache's length.
    model = tiny_model(attention=scheme, style=style, norm_first=norm_first,
                       decoder_positions=decoder_positions)
    src, mask = padded_sources([9, 4, 16, 1], vocab=40)
    gen = torch.Generator().manual_seed(5)
    prefix = torch.randint(3, 40, (4, 8), generator=gen)
    with torch.no_grad():
        memory = model.encode(src, mask)
        full = model.decode_hidden(prefix, memory, mask)
        cache = model.start_decoding(memory, mask)
        assert isinstance(cache, DecoderCache)
        for t in range(prefix.shape[1]):
            step = model.decode_step(prefix[:, t], cache)
            torch.testing.assert_close(step, full[:, t], atol=1e-5, rtol=1e-5)
        order = torch.tensor([2, 0, 3, 1])  # rows of other examples: the article's K/V move too
        cache.select(order)
        nxt = torch.randint(3, 40, (4, 1), generator=gen)
        longer = torch.cat([prefix[order], nxt], dim=1)
        expected = model.decode_hidden(longer, memory[order], mask[order])[:, -1]
        torch.testing.assert_close(model.decode_step(nxt[:, 0], cache), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("style", ["headline", "mt"])
@pytest.mark.parametrize("inside", ["none", "rope", "alibi"])
def test_decoder_positions_move_into_the_self_attention(style, inside):
    """The decoder's embedding loses its position term (keeping its style: LayerNorm or the
    sqrt(d) scale), its self-attention gains the positions; cross-attention has none and the
    encoder keeps its table."""
    model = tiny_model(attention="unas", style=style, decoder_positions=inside)
    plain = tiny_model(attention="unas", style=style)
    embeddings = model.decoder_embeddings
    assert embeddings.position is None and embeddings.sinusoids is None
    assert type(embeddings.norm) is type(plain.decoder_embeddings.norm)
    assert embeddings.scale == plain.decoder_embeddings.scale
    for layer in model.decoder_layers:
        assert layer.self_attn.positions.scheme == inside
        assert layer.cross_attn.positions.scheme == "none"
    assert (model.encoder_embeddings.position is not None) == (style == "headline")
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        word = model.decoder_embeddings(ids)
    expected_word = model.word_embeddings(ids) * (plain.decoder_embeddings.scale or 1.0)
    torch.testing.assert_close(word, model.decoder_embeddings.norm(expected_word))


def test_decoder_positions_are_checked():
    with pytest.raises(ConfigError, match=r"positions='rope'.*decoder_positions=rope"):
        tiny_model(positions="rope")
    with pytest.raises(ConfigError, match=r"decoder_positions='xpos'.*none, rope, alibi"):
        tiny_model(decoder_positions="xpos")
    with pytest.raises(ConfigError, match="one embedding style"):
        tiny_model(style="mt", decoder_positions="learned")


def test_prefix_store_and_cache_agree_on_a_cascade(one_thread):
    # PrefixCache re-runs the whole decoder on the prefix (exact by construction): the cached
    # cascade steps must give the same states
    src, mask = padded_sources([9, 4, 16], vocab=40)
    prefix = torch.randint(3, 40, (3, 5), generator=torch.Generator().manual_seed(2))
    model = tiny_model(attention="coda")
    with torch.no_grad():
        memory = model.encode(src, mask)
        cache, fallback = model.start_decoding(memory, mask), PrefixCache(memory, mask)
        for t in range(prefix.shape[1]):
            torch.testing.assert_close(model.decode_step(prefix[:, t], cache),
                                       model.decode_step(prefix[:, t], fallback), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("scheme", ["coda", "realformer"])
def test_beam_search_on_a_cached_cascade_equals_the_prefix_rerun(scheme, one_thread, monkeypatch):
    # beam search reorders the cache (select) between steps: the reordered key/value cache of a
    # cascade must decode exactly what re-running the prefix decodes
    src, mask = padded_sources([9, 4, 16], vocab=40)
    model = tiny_model(attention=scheme)
    options = {"bos_id": BOS, "eos_id": EOS, "pad_id": PAD, "max_length": 8, "beam_size": 3}
    cached = beam_search(model, src, mask, **options)
    monkeypatch.setattr(model, "start_decoding", lambda memory, m: PrefixCache(memory, m))
    assert torch.equal(cached, beam_search(model, src, mask, **options))


def test_restricted_output_vocabulary(one_thread):
    model = tiny_model()
    hidden = torch.randn(5, 32)
    with torch.no_grad():
        every = model.project(hidden)
        allowed = [PAD, EOS, 7, 11, 30]
        model.set_output_vocab([30, 7, EOS, 11, PAD, 7])  # unsorted, repeated: sorted and unique
        assert model.output_ids.tolist() == sorted(allowed)
        logits = model.project(hidden)
        # same logits on the allowed tokens, -inf elsewhere; output_logits are the allowed columns
        torch.testing.assert_close(logits[:, sorted(allowed)], every[:, sorted(allowed)])
        assert torch.isinf(logits).sum().item() == 5 * (40 - len(allowed))
        torch.testing.assert_close(model.output_logits(hidden), logits[:, sorted(allowed)])
        # token ids -> output positions, unknown ones -> the position of the given unknown id
        assert model.output_index(torch.tensor([30, 11, 5]), unknown_id=PAD).tolist() == [4, 3, 0]
        src, mask = padded_sources([9, 4, 16], vocab=40)
        beam = beam_search(model, src, mask, bos_id=BOS, eos_id=EOS, pad_id=PAD, max_length=8,
                           beam_size=3)
        assert set(beam.flatten().tolist()) <= set(allowed)
        # teacher forcing: logits and labels of the real target tokens only, as output positions
        tgt = torch.tensor([[BOS, 30, 5, EOS], [BOS, 11, EOS, PAD], [BOS, EOS, PAD, PAD]])
        target_logits, labels = model.target_logits(src, tgt, unknown_id=PAD)
        assert target_logits.shape == (6, 5) and labels.tolist() == [4, 0, 1, 3, 1, 1]
    with pytest.raises(ConfigError, match="output vocabulary"):
        model.set_output_vocab([3, 99])


def test_beam_one_equals_greedy_exactly(one_thread):
    model = peaked(tiny_model())
    src, mask = padded_sources([9, 4, 16, 1, 7, 12], vocab=40)
    assert_beam_one_is_greedy(model, src, mask)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_stopping_early_returns_what_searching_to_max_length_returns(alpha, one_thread):
    # peaked models nudged to EOS: some hypotheses finish at once, others never do. (The grid
    # includes a case, alpha 2, where stopping once no running hypothesis is ahead *now* would
    # change the result: the bound must look at the largest length penalty still reachable.)
    stopped_sooner = 0
    for scale, eos_bias, seed, beam_size in itertools.product((3.0, 10.0), (0.5, 2.0, 4.0), range(4),
                                                              (2, 4)):
        model = peaked(tiny_model(seed=seed, attention="unas"), scale=scale, eos_bias=eos_bias)
        src, mask = padded_sources([9, 4, 16, 1, 7, 12], vocab=40, seed=seed)
        options = {"bos_id": BOS, "eos_id": EOS, "pad_id": PAD, "max_length": 11,
                   "beam_size": beam_size, "length_penalty": alpha}
        early = beam_search(model, src, mask, **options)
        full = beam_search(model, src, mask, stop_early=False, **options)
        width = early.shape[1]
        assert torch.equal(early, full[:, :width]) and (full[:, width:] == PAD).all()
        stopped_sooner += width < full.shape[1]
    assert stopped_sooner > 0  # the cases above do reach the early stop


@torch.no_grad()
def _sequence_log_probs(model, src, mask, sequences):
    """Total log-probability of each token sequence (one batched teacher-forced pass)."""
    width = max(len(s) for s in sequences)
    prefix = torch.full((len(sequences), width + 1), PAD)
    prefix[:, 0] = BOS
    for row, tokens in enumerate(sequences):
        prefix[row, 1 : len(tokens) + 1] = torch.tensor(tokens)
    memory = model.encode(src, mask).expand(len(sequences), -1, -1)
    log_probs = torch.log_softmax(model.decode(prefix, memory, mask.expand(len(sequences), -1)), -1)
    picked = log_probs[:, :-1].gather(2, prefix[:, 1:, None]).squeeze(2)
    lengths = torch.tensor([len(s) for s in sequences])
    return (picked * (torch.arange(width)[None] < lengths[:, None])).sum(1), lengths


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_wide_beam_finds_the_exact_best_sequence(alpha):
    # Vocabulary of 5 and at most 3 steps: a beam of 5**3 keeps every hypothesis, so beam search
    # must return the best length-normalized sequence of an exhaustive search.
    vocab, max_length = 5, 3
    model = tiny_model(vocab=vocab, attention="unas", seed=3)
    with torch.no_grad():
        model.output_bias[EOS] = 1.0
    src, mask = padded_sources([6], vocab=vocab, seed=4)
    # Every complete hypothesis: ends with its first EOS, or runs to max_length without one.
    sequences = [
        list(tokens)
        for length in range(1, max_length + 1)
        for tokens in itertools.product(range(vocab), repeat=length)
        if EOS not in tokens[:-1] and (tokens[-1] == EOS or length == max_length)
    ]
    scores, lengths = _sequence_log_probs(model, src, mask, sequences)
    best = sequences[int((scores / length_penalty_factor(lengths, alpha)).argmax())]
    got = beam_search(model, src, mask, bos_id=BOS, eos_id=EOS, pad_id=PAD, max_length=max_length,
                      beam_size=vocab**max_length, length_penalty=alpha)
    row = got[0].tolist()
    row = row[: row.index(EOS) + 1] if EOS in row else row
    assert row == best


def test_max_length_beyond_decoder_positions_is_refused():
    model = tiny_model()
    src, mask = padded_sources([3], vocab=40)
    with pytest.raises(ConfigError, match="positions"):
        greedy_decode(model, src, mask, bos_id=BOS, eos_id=EOS, pad_id=PAD, max_length=12)


def test_fairseq_style_embeddings_head_and_initialization():
    table = sinusoids(10, 8)  # half = 4 frequencies 10000^(-i/3): sines, then cosines
    for pos, i in [(3, 0), (7, 2), (9, 3)]:
        angle = pos * 10000 ** (-i / 3)
        assert table[pos, i].item() == pytest.approx(math.sin(angle), abs=1e-6)
        assert table[pos, 4 + i].item() == pytest.approx(math.cos(angle), abs=1e-6)
    model = tiny_model(vocab=300, attention="coda", style="mt", d_model=64, dim_feedforward=128)
    names = set(model.state_dict())
    # fixed positions, no LayerNorm on the embeddings, no LM-head transform, no output bias
    assert not any(n.startswith(("encoder_embeddings.position", "encoder_embeddings.norm", "head_transform"))
                   or n == "output_bias" for n in names)
    ids = torch.tensor([[5, 9, 4], [7, 7, PAD]])
    word = model.word_embeddings.weight
    with torch.no_grad():
        expected = word[ids] * 8.0 + sinusoids(12, 64)[:3][None]
        torch.testing.assert_close(model.decoder_embeddings(ids), expected)
        torch.testing.assert_close(model.decoder_embeddings(ids[:, 1:], start=1), expected[:, 1:])
        hidden = torch.randn(3, 64)
        torch.testing.assert_close(model.project(hidden), hidden @ word.t())
    # fairseq's initialization: embeddings N(0, 1/d) with a zero padding row, Xavier-uniform
    # linears (q/k/v with gain 1/sqrt(2)), zero biases; CODA's head MLP keeps its own
    assert word[PAD].abs().sum() == 0 and word.std().item() == pytest.approx(64 ** -0.5, rel=0.05)
    layer = model.encoder_layers[1]

    def bound(weight, gain):
        return gain * math.sqrt(6 / sum(weight.shape))

    q, ff = layer.self_attn.q_proj.weight, layer.linear1.weight
    assert q.abs().max() <= bound(q, 2 ** -0.5) and q.abs().max() > 0.9 * bound(q, 2 ** -0.5)
    assert ff.abs().max() <= bound(ff, 1.0) and ff.abs().max() > 0.9 * bound(ff, 1.0)
    assert all(m.bias.abs().sum() == 0 for m in model.modules() if isinstance(m, torch.nn.Linear))
    mixer = [m for m in layer.self_attn.transform.modules() if isinstance(m, torch.nn.Linear)]
    assert mixer and all(m.weight.abs().max() <= bound(m.weight, 2 ** -0.5) for m in mixer)


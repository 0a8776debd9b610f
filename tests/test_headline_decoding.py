"""Headline model: decoder guard, greedy vs beam search, exact search, ROUGE vs rouge-score, overfit."""

from __future__ import annotations

import itertools

import pytest
import torch

from attnlab.errors import ConfigError
from tasks.common.decoding import (
    beam_search,
    greedy_decode,
    length_penalty_factor,
    strip_generated,
)
from tasks.headline.model import HeadlineTransformer
from tasks.headline.rouge import make_rouge, rouge_f1

PAD, BOS, EOS = 0, 1, 2


@pytest.fixture
def one_thread():
    # Tiny tensors run faster on one thread, above all when the cores are shared.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_model(vocab=40, attention="hnas", seed=0, **kwargs):
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
    }
    args.update(kwargs)
    return HeadlineTransformer(vocab, PAD, attention=attention, **args).eval()


def padded_sources(lengths, vocab, seed=1):
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(3, vocab, (len(lengths), max(lengths)), generator=gen)
    for row, length in enumerate(lengths):
        src[row, length:] = PAD
    return src, src.eq(PAD)


@pytest.mark.parametrize("scheme", ["dnas", "hnas", "sinkhorn"])
def test_query_normalized_decoder_attention_is_refused(scheme):
    with pytest.raises(ConfigError, match="decoder"):
        tiny_model(attention="unas", decoder_attention=scheme)


def test_query_normalized_encoder_attention_is_allowed():
    model = tiny_model(attention={"scheme": "dnas"})
    assert all(layer.self_attn.scheme == "dnas" for layer in model.encoder_layers)
    assert all(layer.cross_attn.scheme == "unas" for layer in model.decoder_layers)


@pytest.mark.parametrize("norm_first", [False, True])
def test_cached_decode_step_equals_the_full_decoder(one_thread, norm_first):
    # The key/value cache must give, at every position, the state of the full teacher-forced
    # decoder on the prefix; also after reordering rows as beam search does.
    model = tiny_model(norm_first=norm_first)
    src, mask = padded_sources([9, 4, 16, 1], vocab=40)
    gen = torch.Generator().manual_seed(5)
    prefix = torch.randint(3, 40, (4, 8), generator=gen)
    with torch.no_grad():
        memory = model.encode(src, mask)
        full = model.decode_hidden(prefix, memory, mask)
        cache = model.start_decoding(memory, mask)
        for t in range(prefix.shape[1]):
            step = model.decode_step(prefix[:, t], cache)
            torch.testing.assert_close(step, full[:, t], atol=1e-5, rtol=1e-5)
        order = torch.tensor([2, 0, 3, 1])  # rows of other examples: the article's K/V move too
        cache.select(order)
        nxt = torch.randint(3, 40, (4, 1), generator=gen)
        longer = torch.cat([prefix[order], nxt], dim=1)
        expected = model.decode_hidden(longer, memory[order], mask[order])[:, -1]
        torch.testing.assert_close(model.decode_step(nxt[:, 0], cache), expected, atol=1e-5, rtol=1e-5)


def test_cascaded_decoders_fall_back_to_the_exact_prefix_decoder(one_thread):
    from tasks.common.incremental import DecoderCache, PrefixCache

    src, mask = padded_sources([9, 4, 16], vocab=40)
    prefix = torch.randint(3, 40, (3, 5), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        # CODA cascades logits through the decoder stack: no per-layer cache, the prefix is re-run
        coda = tiny_model(attention="coda")
        memory = coda.encode(src, mask)
        state = coda.start_decoding(memory, mask)
        assert isinstance(state, PrefixCache)
        full = coda.decode_hidden(prefix, memory, mask)
        for t in range(prefix.shape[1]):
            torch.testing.assert_close(coda.decode_step(prefix[:, t], state), full[:, t])
        # the fallback and the cache agree on a plain UNAS decoder
        plain = tiny_model()
        memory = plain.encode(src, mask)
        cache, fallback = plain.start_decoding(memory, mask), PrefixCache(memory, mask)
        assert isinstance(cache, DecoderCache)
        for t in range(prefix.shape[1]):
            torch.testing.assert_close(plain.decode_step(prefix[:, t], cache),
                                       plain.decode_step(prefix[:, t], fallback), atol=1e-5, rtol=1e-5)


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
    with pytest.raises(ConfigError, match="output vocabulary"):
        model.set_output_vocab([3, 99])


def test_beam_one_equals_greedy_exactly(one_thread):
    model = tiny_model()
    with torch.no_grad():
        # Weights of std 0.2 instead of 0.02 give peaked next-token distributions, and a nudge
        # to EOS makes some rows finish early while others run to max_length.
        for weight in model.parameters():
            if weight.dim() > 1:
                weight.mul_(10)
        model.output_bias[EOS] = 0.5
    src, mask = padded_sources([9, 4, 16, 1, 7, 12], vocab=40)
    greedy = greedy_decode(model, src, mask, bos_id=BOS, eos_id=EOS, pad_id=PAD, max_length=10)
    lengths = [len(r) for r in strip_generated(greedy, EOS, PAD)]
    assert min(lengths) < 10 and max(lengths) == 10, lengths  # both kinds of rows are covered
    for alpha in (0.0, 0.6, 2.0):
        beam = beam_search(
            model,
            src,
            mask,
            bos_id=BOS,
            eos_id=EOS,
            pad_id=PAD,
            max_length=10,
            beam_size=1,
            length_penalty=alpha,
        )
        assert torch.equal(beam, greedy)


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
    got = beam_search(
        model,
        src,
        mask,
        bos_id=BOS,
        eos_id=EOS,
        pad_id=PAD,
        max_length=max_length,
        beam_size=vocab**max_length,
        length_penalty=alpha,
    )
    row = got[0].tolist()
    row = row[: row.index(EOS) + 1] if EOS in row else row
    assert row == best


def test_max_length_beyond_decoder_positions_is_refused():
    model = tiny_model()
    src, mask = padded_sources([3], vocab=40)
    with pytest.raises(ConfigError, match="positions"):
        greedy_decode(model, src, mask, bos_id=BOS, eos_id=EOS, pad_id=PAD, max_length=12)


# Hand-checked: "cats" stems to "cat" (tokens longer than 3 characters are stemmed).
#   ROUGE-1: 5 of 6 unigrams match both ways -> F1 5/6; ROUGE-2: 3 of 5 bigrams -> 0.6;
#   ROUGE-L: LCS "the cat sat on mat" = 5 -> 5/6.
HAND_CHECKED = [("the cats sat on the mat", "the cat sat on a mat", (5 / 6, 0.6, 5 / 6))]
MORE_PAIRS = [
    ("police arrest three men after warehouse fire", "three arrested after warehouse fire"),
    ("Fast compression library -- runtime files", "fast quux compression library - runtime files"),
    ("running runners ran quickly", "the runner runs quick"),
    ("completely different words", "nothing in common here"),
    ("central bank holds rates", "central bank holds rates"),
]


def test_rouge_hand_checked_values():
    ((pred, ref, expected),) = HAND_CHECKED
    scores = rouge_f1(make_rouge()([pred], [ref]))
    assert [scores[k] for k in ("rouge1", "rouge2", "rougeL")] == pytest.approx(expected, abs=1e-6)


def test_lead_baseline_takes_the_first_words():
    from tasks.headline.baseline import lead, lead_scores

    assert lead("  GOMP is an  implementation of OpenMP", 3) == "GOMP is an"
    assert lead("short", 8) == "short"
    # lead-3 of the hand-checked pair: "the cats sat" vs "the cat sat on a mat": 3 of 3 and 3 of 6
    # unigrams -> F1 2/3; bigrams 2 of 2 and 2 of 5 -> F1 4/7
    scores = lead_scores(["the cats sat on the mat"], ["the cat sat on a mat"], 3)
    assert scores["rouge1"] == pytest.approx(2 / 3) and scores["rouge2"] == pytest.approx(4 / 7)


def test_rouge_matches_rouge_score_package():
    rouge_scorer = pytest.importorskip("rouge_score.rouge_scorer")
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    pairs = [(p, r) for p, r, _ in HAND_CHECKED] + MORE_PAIRS
    reference = {k: [] for k in ("rouge1", "rouge2", "rougeL")}
    for pred, ref in pairs:
        single = rouge_f1(make_rouge()([pred], [ref]))
        for key, value in scorer.score(ref, pred).items():  # rouge-score takes (target, prediction)
            assert single[key] == pytest.approx(value.fmeasure, abs=1e-6), (key, pred, ref)
            reference[key].append(value.fmeasure)
    metric = make_rouge()
    for pred, ref in pairs:  # accumulated over updates, as in the val/test loops
        metric.update([pred], [ref])
    corpus = rouge_f1(metric.compute())
    for key, values in reference.items():
        assert corpus[key] == pytest.approx(sum(values) / len(values), abs=1e-6)


def test_tiny_model_memorizes_pairs_and_greedy_reproduces_them(one_thread):
    from tasks.headline.module import sequence_loss

    vocab = 30
    model = tiny_model(vocab=vocab, attention={"scheme": "hnas", "hybrid_init": 0.1})
    gen = torch.Generator().manual_seed(7)
    sources = [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in (7, 10, 5, 9)]
    headlines = [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in (4, 6, 3, 5)]
    src = torch.full((4, 10), PAD)
    tgt = torch.full((4, 8), PAD)
    for row, (s, h) in enumerate(zip(sources, headlines)):
        src[row, : len(s)] = torch.tensor(s)
        tgt[row, : len(h) + 2] = torch.tensor([BOS] + h + [EOS])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(50):
        loss = sequence_loss(model(src, tgt[:, :-1]), tgt[:, 1:], PAD)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    assert loss.item() < 0.05
    greedy = greedy_decode(
        model, src, src.eq(PAD), bos_id=BOS, eos_id=EOS, pad_id=PAD, max_length=10
    )
    assert strip_generated(greedy, EOS, PAD) == headlines
    beam = beam_search(
        model,
        src,
        src.eq(PAD),
        bos_id=BOS,
        eos_id=EOS,
        pad_id=PAD,
        max_length=10,
        beam_size=3,
        length_penalty=0.6,
    )
    assert strip_generated(beam, EOS, PAD) == headlines

"""Headline: ROUGE against rouge-score and hand-checked values, the lead baseline, and a tiny
encoder-decoder that memorizes pairs (greedy and beam search reproduce them). The encoder-decoder
itself, its cache and the searches: tests/test_seq2seq.py."""

from __future__ import annotations

import pytest
import torch
from helpers.seq2seq_cases import BERT_STYLE

from tasks.common.decoding import beam_search, greedy_decode, strip_generated
from tasks.common.seq2seq import Seq2SeqTransformer
from tasks.headline.rouge import make_rouge, rouge_f1

PAD, BOS, EOS = 0, 1, 2


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
    torch.manual_seed(0)
    model = Seq2SeqTransformer(vocab, PAD, attention={"scheme": "hnas", "hybrid_init": 0.1}, d_model=32,
                               num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=64,
                               dropout=0.0, max_source_positions=16, max_target_positions=12,
                               **BERT_STYLE)
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

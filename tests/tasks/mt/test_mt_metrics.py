"""mt metrics: corpus BLEU / chrF equal to sacrebleu, summed across processes; predictions.tsv."""

from __future__ import annotations

import csv

import pytest
import sacrebleu
from helpers.paths import FIXTURES as FIXTURE_ROOT

from attnlab.errors import ConfigError
from tasks.common.lines import read_lines
from tasks.common.predictions import write_predictions
from tasks.mt.metrics import TranslationScores
from tasks.mt.parallel import read_split

FIXTURES = FIXTURE_ROOT / "mt"
REFERENCES = read_lines(FIXTURES / "bleu" / "ref.en")
HYPOTHESES = read_lines(FIXTURES / "bleu" / "hyp.en")  # line 9 is empty: a failed translation


def _scores(hypotheses, references, chunks=(5, 2, 5), **kwargs):
    metric = TranslationScores(**kwargs)
    start = 0
    for size in chunks:  # batches of uneven size, as a test loop feeds them
        metric.update(hypotheses[start : start + size], references[start : start + size])
        start += size
    assert start == len(hypotheses)
    return metric


def test_bleu_and_chrf_equal_sacrebleu_on_detokenized_text():
    metric = _scores(HYPOTHESES, REFERENCES)
    bleu = sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES])
    chrf = sacrebleu.corpus_chrf(HYPOTHESES, [REFERENCES])
    assert 10 < bleu.score < 90  # the fixture is neither trivial nor hopeless
    assert metric.compute() == {"bleu": bleu.score, "chrf": chrf.score}  # exactly, not approximately
    signature = metric.signature()
    assert signature["bleu"] == "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:" + sacrebleu.__version__
    assert signature["chrf"].startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no")


def test_tokenized_lowercase_bleu_equals_sacrebleu_with_the_same_options():
    # the papers' IWSLT14 setting: BLEU on Moses-tokenized, lower-cased text
    pairs = read_split(FIXTURES / "iwslt14", "train", "de", "en", "@@ ")
    references = [p.target for p in pairs]
    hypotheses = [" ".join(reversed(r.split()[:4])) + " " + " ".join(r.split()[4:]) for r in references]
    metric = _scores(hypotheses, references, chunks=(3, 4), tokenize="none", lowercase=True)
    expected = sacrebleu.corpus_bleu(hypotheses, [references], tokenize="none", lowercase=True)
    assert metric.compute()["bleu"] == expected.score
    assert "tok:none" in metric.signature()["bleu"] and "case:lc" in metric.signature()["bleu"]


def test_scores_of_several_processes_sum_statistics_not_scores():
    # what DDP's all-reduce does with the states: the result is the whole corpus's score
    first, second = TranslationScores(), TranslationScores()
    first.update(HYPOTHESES[:3], REFERENCES[:3])
    second.update(HYPOTHESES[3:], REFERENCES[3:])
    first.merge_state(second)
    whole = sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES]).score
    assert first.compute()["bleu"] == whole
    halves = [sacrebleu.corpus_bleu(HYPOTHESES[s], [REFERENCES[s]]).score for s in (slice(0, 3), slice(3, None))]
    assert abs(sum(halves) / 2 - whole) > 1  # averaging per-process scores would be wrong


@pytest.mark.filterwarnings("ignore:The ``compute`` method of metric TranslationScores was called before")
def test_metric_edge_cases():
    metric = TranslationScores()
    assert metric.compute() == {"bleu": 0.0, "chrf": 0.0}
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        metric.update(["a", "b"], ["a"])
    metric.update(HYPOTHESES, REFERENCES)
    metric.reset()
    assert metric.compute()["bleu"] == 0.0
    with pytest.raises(ConfigError, match="13a"):
        TranslationScores(tokenize="moses")


def test_predictions_tsv_has_one_line_per_example(tmp_path):
    rows = [("Ein\tTab", "A tab", "a\ttab"), ("Zwei\nZeilen", 'Two "lines"', "")]
    path = tmp_path / "run" / "predictions.tsv"
    assert write_predictions(path, rows) == 2
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 3 and lines[0] == "source\treference\thypothesis"
    with open(path, encoding="utf-8", newline="") as f:
        read = list(csv.reader(f, delimiter="\t"))
    assert read[1:] == [["Ein Tab", "A tab", "a tab"], ["Zwei Zeilen", 'Two "lines"', ""]]
    with pytest.raises(ValueError, match="2 fields"):
        write_predictions(path, [("only", "two")])

"""VQA accuracy: answer normalization rules and the leave-one-out min(#/3, 1) score."""

import math

import pytest
import torch

from tasks.vqa.metric import (
    VQAAccuracy,
    answer_scores,
    normalize_answer,
    vqa_accuracy,
)


def literal_vqa_accuracy(prediction: str, answers: list[str]) -> float:
    """The official loop, written out: for each annotator, compare with the other nine."""
    prediction = normalize_answer(prediction)
    answers = [normalize_answer(a) for a in answers]
    accs = []
    for left_out in range(len(answers)):
        others = answers[:left_out] + answers[left_out + 1 :]
        accs.append(min(1.0, sum(a == prediction for a in others) / 3))
    return sum(accs) / len(accs)


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("Two", "2"),  # lower-case, number word -> digit
        ("none", "0"),
        ("ten", "10"),
        ("a dog.", "dog"),  # article and trailing period removed
        ("The Cat", "cat"),
        ("an apple", "apple"),
        ("dont", "don't"),  # contraction restored
        ("couldnt've", "couldn't've"),
        ("Yes!", "yes"),  # punctuation glued to a word becomes a space, then trimmed
        ("black-and-white", "black and white"),
        ("yes , sir", "yes sir"),  # punctuation next to a space disappears
        ("1,000", "1000"),  # digit,digit: punctuation deleted, not spaced
        ("3.5", "3.5"),  # a period before a digit stays
        ("  red\tcar\n", "red car"),
        ("the two dogs", "2 dogs"),
    ],
)
def test_normalize_answer(raw, expected):
    assert normalize_answer(raw) == expected


@pytest.mark.parametrize(
    "matches, expected",
    # given by c of 10 annotators: (c * min((c-1)/3, 1) + (10-c) * min(c/3, 1)) / 10
    [(0, 0.0), (1, 0.3), (2, 0.6), (3, 0.9), (4, 1.0), (10, 1.0)],
)
def test_accuracy_by_number_of_matching_annotators(matches, expected):
    answers = ["cat"] * matches + ["dog"] * (10 - matches)
    assert vqa_accuracy("cat", answers) == pytest.approx(expected)
    assert literal_vqa_accuracy("cat", answers) == pytest.approx(expected)


def test_accuracy_uses_normalization_on_both_sides():
    answers = ["two"] * 2 + ["2"] + ["3"] * 7  # three annotators said 2, spelled two ways
    assert vqa_accuracy("Two.", answers) == pytest.approx(0.9)
    assert vqa_accuracy("3", answers) == pytest.approx(1.0)
    assert vqa_accuracy("4", answers) == 0.0


def test_closed_form_matches_literal_loop():
    gen = torch.Generator().manual_seed(0)
    vocab = ["yes", "no", "2", "two", "a red car", "red car", "blue"]
    for _ in range(200):
        answers = [vocab[i] for i in torch.randint(len(vocab), (10,), generator=gen)]
        for prediction in vocab:
            assert vqa_accuracy(prediction, answers) == pytest.approx(
                literal_vqa_accuracy(prediction, answers)
            )


def test_answer_scores_of_each_distinct_answer():
    scores = answer_scores(["a"] * 6 + ["b"] * 3 + ["c"])
    assert scores == pytest.approx({"a": 1.0, "b": 0.9, "c": 0.3})


def test_metric_string_and_index_inputs_agree_with_per_type_accuracy():
    gts = [["2"] * 10, ["yes"] * 8 + ["no"] * 2, ["red"] * 2 + ["blue"] * 8]
    preds = ["two", "no", "red"]
    types = ["number", "yes/no", "other"]
    expected = [1.0, 0.6, 0.6]

    by_string = VQAAccuracy(question_types=["yes/no", "number", "other"])
    by_string.update(preds, gts, types)
    out = by_string.compute()
    assert out["acc"].item() == pytest.approx(sum(expected) / 3)
    assert out["acc_yes_no"].item() == pytest.approx(0.6)
    assert out["acc_number"].item() == pytest.approx(1.0)
    assert out["acc_other"].item() == pytest.approx(0.6)

    vocab = ["2", "yes", "no", "red", "blue"]
    table = torch.zeros(3, len(vocab))
    for q, answers in enumerate(gts):
        for answer, score in answer_scores([normalize_answer(a) for a in answers]).items():
            table[q, vocab.index(answer)] = score
    by_index = VQAAccuracy(question_types=["yes/no", "number", "other"])
    by_index.update(torch.tensor([0, 2, 3]), table, torch.tensor([1, 0, 2]))
    for key, value in by_index.compute().items():
        assert value.item() == pytest.approx(out[key].item(), abs=1e-6), key


def test_metric_states_sum_across_processes_and_empty_type_is_nan():
    # What DDP does at compute(): every state is reduced with sum; merge_state applies the same
    # reductions to two processes' states.
    first, second = VQAAccuracy(["a", "b", "c"]), VQAAccuracy(["a", "b", "c"])
    assert set(first._reductions.values()) == {first._reductions["count"]}
    first.update(["x"], [["x"] * 10], ["a"])
    second.update(["y", "y"], [["x"] * 10, ["y"] * 3 + ["x"] * 7], ["b", "b"])
    first.merge_state(second)
    out = first.compute()
    assert out["acc"].item() == pytest.approx((1.0 + 0.0 + 0.9) / 3)
    assert out["acc_a"].item() == pytest.approx(1.0)
    assert out["acc_b"].item() == pytest.approx(0.45)
    assert math.isnan(out["acc_c"].item())


def test_metric_rejects_unknown_question_type():
    metric = VQAAccuracy(["a"])
    with pytest.raises(ValueError, match="known question types"):
        metric.update(["x"], [["x"] * 10], ["zzz"])


# The official table (GT-Vision-Lab/VQA, vqaEval.py `contractions`) maps listed spellings only,
# one word at a time, after lower-casing; each case below is read off that table by hand.
@pytest.mark.parametrize(
    "raw, expected",
    [
        # real words that are not keys of the official table stay as they are
        ("well", "well"),
        ("shell", "shell"),
        ("its", "its"),
        ("ill", "ill"),
        ("hell", "hell"),
        ("wed", "wed"),
        ("were", "were"),
        ("id", "id"),
        ("lets", "lets"),
        # keys of the official table
        ("twas", "'twas"),
        ("yall'll", "y'all'll"),
        ("y'allll", "y'all'll"),
        ("yall", "y'all"),
        ("oclock", "o'clock"),
        ("ow's'at", "'ow's'at"),
        ("couldnt've", "couldn't've"),
        ("hes", "he's"),
        ("whats that", "what's that"),
        # the official table maps this one backwards; kept
        ("somebody'd", "somebodyd"),
        # its capitalised keys (Im, Ive, Id've) never match: the table is applied after lower-casing
        ("Im", "im"),
        ("Ive", "ive"),
        ("Id've", "id've"),
        # spellings the table does not list stay, even where a contraction is meant
        ("couldntve", "couldntve"),
        ("didn't", "didn't"),
        ("wouldnt've", "wouldn't've"),
        ("wouldntve", "wouldntve"),
    ],
)
def test_contractions_follow_the_official_table(raw, expected):
    assert normalize_answer(raw) == expected


def test_scores_with_words_the_official_table_leaves_alone():
    # "well" is not a key of the official table: 3 annotators said "well", 7 "we'll"
    answers = ["we'll"] * 7 + ["well"] * 3
    assert vqa_accuracy("well", answers) == pytest.approx(0.9)
    assert vqa_accuracy("we'll", answers) == pytest.approx(1.0)
    assert vqa_accuracy("its", ["it's"] * 10) == 0.0
    assert vqa_accuracy("twas", ["'twas"] * 2 + ["no"] * 8) == pytest.approx(0.6)

"""Reference points for `classify`: majority class and bag-of-words logistic regression.

    python -m tasks.classify.baselines                                   # Debian sections (default data)
    python -m tasks.classify.baselines --source tsv --data-dir data/yelp
    python -m tasks.classify.baselines --source snli --data-dir data/snli_1.0 --json baselines.json

Bag of words: TF-IDF of lower-cased unigrams seen in >= 2 training texts (sublinear tf), then
multinomial logistic regression (scikit-learn, lbfgs). Its inverse regularization C is chosen on
val from `--C` (so its val numbers are optimistic; test is not). For pairs (SNLI) the premise's
and the hypothesis' bags are concatenated, as a BoW model cannot otherwise tell them apart.
Accuracy and macro-F1 (the mean of the per-class F1, which weighs rare classes like large ones).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from attnlab.errors import ConfigError, command, require_dir
from tasks.classify import corpus as corpus_lib
from tasks.classify import readers
from tasks.classify.corpus import Corpus

EVAL_SPLITS = ("val", "test")
# what --data-dir looks like per --source, for the errors' examples
EXAMPLE_DIRS = {"debian": "data/debian_sections", "tsv": "data/yelp", "snli": "data/snli_1.0"}


def scores(gold: Sequence[int], predicted: Sequence[int]) -> dict[str, float]:
    from sklearn.metrics import accuracy_score, f1_score

    return {"acc": float(accuracy_score(gold, predicted)),
            "macro_f1": float(f1_score(gold, predicted, average="macro", zero_division=0))}


def majority_baseline(corpus: Corpus) -> dict:
    """Always predict the most frequent training label."""
    label = Counter(corpus.labels("train")).most_common(1)[0][0]
    return {split: scores(corpus.labels(split), [label] * len(corpus.splits[split])) for split in EVAL_SPLITS}


def bow_logreg_baseline(corpus: Corpus, cs: Sequence[float] = (1.0, 10.0), min_df: int = 2) -> dict:
    """TF-IDF bag of words + logistic regression; C picked by val accuracy. Returns scores and C."""
    from scipy.sparse import hstack
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    train = corpus.splits["train"]
    vectorizer = TfidfVectorizer(lowercase=True, min_df=min(min_df, len(train)), sublinear_tf=True)
    vectorizer.fit([e.text for e in train] + ([e.text_b for e in train] if corpus.pair else []))

    def features(split: str):
        examples = corpus.splits[split]
        x = vectorizer.transform([e.text for e in examples])
        return hstack([x, vectorizer.transform([e.text_b for e in examples])]).tocsr() if corpus.pair else x

    x = {split: features(split) for split in ("train", *EVAL_SPLITS)}
    best, val_acc_per_c = None, {}
    for c in cs:
        model = LogisticRegression(C=float(c), max_iter=2000).fit(x["train"], corpus.labels("train"))
        result = {split: scores(corpus.labels(split), model.predict(x[split])) for split in EVAL_SPLITS}
        val_acc_per_c[float(c)] = result["val"]["acc"]
        if best is None or result["val"]["acc"] > best["val"]["acc"]:
            best = {**result, "C": float(c)}
    return {**best, "val_acc_per_C": val_acc_per_c, "features": len(vectorizer.vocabulary_) * (2 if corpus.pair else 1)}


def run(corpus: Corpus, cs: Sequence[float] = (1.0, 10.0)) -> dict:
    sizes = {split: len(examples) for split, examples in corpus.splits.items()}
    start = time.time()
    bow = bow_logreg_baseline(corpus, cs)
    return {
        "classes": len(corpus.label_names),
        "examples": sizes,
        "train_label_counts": dict(Counter(e.label for e in corpus.splits["train"]).most_common()),
        "majority": majority_baseline(corpus),
        "bow_logreg": bow,
        "bow_seconds": round(time.time() - start, 1),
    }


def format_table(result: dict) -> str:
    lines = [
        f"classes: {result['classes']}   examples: {result['examples']}",
        "| baseline | val acc | val macro-F1 | test acc | test macro-F1 |",
        "|---|---|---|---|---|",
    ]
    for name, label in (("majority", "majority class"), ("bow_logreg", f"BoW logistic regression (C={result['bow_logreg']['C']:g})")):
        r = result[name]
        lines.append(f"| {label} | {r['val']['acc']:.3f} | {r['val']['macro_f1']:.3f} | "
                     f"{r['test']['acc']:.3f} | {r['test']['macro_f1']:.3f} |")
    return "\n".join(lines)


@command
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tasks.classify.baselines",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="debian", choices=corpus_lib.SOURCES)
    parser.add_argument("--data-dir", default=None, help="default for debian: data/debian_sections")
    parser.add_argument("--min-examples", type=int, default=500, help="debian: smallest section kept")
    parser.add_argument("--fractions", type=float, nargs=3, default=corpus_lib.DEFAULT_FRACTIONS)
    parser.add_argument("--header", default="auto", choices=readers.HEADER_CHOICES, help="tsv: is the first row a header")
    parser.add_argument("--C", type=float, nargs="+", default=[1.0, 10.0], help="values of C tried on val")
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    args = parser.parse_args(argv)
    data_dir = args.data_dir or (EXAMPLE_DIRS["debian"] if args.source == "debian" else None)
    # checked here, so that the errors name --data-dir rather than the task's config key, and the
    # --json folder before the minutes of fitting rather than after
    example = f"--data-dir {EXAMPLE_DIRS[args.source]}"
    if data_dir is None:
        raise ConfigError(f"--source {args.source} needs --data-dir, the folder of its train, val and "
                          f"test files, e.g. {example}")
    require_dir(data_dir, "--data-dir", example, missing_ok=args.source == "debian")  # debian: fetched into it
    if args.json and not args.json.parent.is_dir():
        raise ConfigError(f"--json {args.json}: the folder {args.json.parent} does not exist; create it "
                          f"or write elsewhere, e.g. --json baselines.json")
    corpus_lib.prepare(args.source, data_dir)
    corpus = corpus_lib.load_corpus(args.source, data_dir, args.min_examples, args.fractions, args.header)
    result = run(corpus, args.C)
    print(format_table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Claim: CODA's heads are more diverse than the Transformer's (CODA paper, head-diversity
analysis: a higher average Jensen-Shannon divergence between the heads' attention distributions).
Measured as `test/avg_jsd` (the HeadDiversity callback), CODA against UNAS, per task and seed;
the verdict is a sign test across them (reproduce/head_diversity.py)."""

from __future__ import annotations

from attnlab.study.reproduce import head_diversity

NAME = "coda_diversity"
TITLE = "CODA's head diversity"
PAPER = "CODA paper, head-diversity analysis (average JSD between heads)"
CLAIM = "CODA's heads attend more differently from one another (higher head JSD) than a Transformer's"
SCHEME, METRIC = "coda", "test/avg_jsd"


def runs(plan) -> list:
    return head_diversity.runs(plan, NAME, SCHEME)


def evaluate(plan, results, out_dir):
    return head_diversity.evaluate(plan, results, globals(), SCHEME, METRIC)

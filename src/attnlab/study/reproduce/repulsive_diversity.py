"""Claim: repulsive attention's heads are farther apart than plain multi-head attention's
(Repulsive attention paper, Table 1: "Dist", the mean pairwise distance of the heads' outputs).
Measured as `test/head_distance` (the HeadDiversity callback), repulsive (SVGD) against UNAS,
per task and seed; the verdict is a sign test across them (reproduce/head_diversity.py)."""

from __future__ import annotations

from attnlab.study.reproduce import head_diversity

NAME = "repulsive_diversity"
TITLE = "Repulsive attention's head diversity"
PAPER = "Repulsive attention paper, Table 1 (Dist)"
CLAIM = "repulsive attention's heads are farther apart (larger head distance) than plain multi-head attention's"
SCHEME, METRIC = "repulsive", "test/head_distance"


def runs(plan) -> list:
    return head_diversity.runs(plan, NAME, SCHEME)


def evaluate(plan, results, out_dir):
    return head_diversity.evaluate(plan, results, globals(), SCHEME, METRIC)

"""Probe tasks: small generated tasks where the mechanisms the papers argue about decide the answer.

One module per probe, each with `generate(n, seed, **options) -> ProbeData` (tasks/probe/data.py):
    recall      associative recall (Zoology's MQAR), with duplicate and distractor keys
    coverage    the count of every token type: every position enters the answer
    clusters    unbalanced clusters of points: count them, or find the minority's centre
    retrieval   an ordered tuple read at several marked positions: one head per position
    listops     ListOps (the Long Range Arena's rules) at reduced length
No download: the data are a function of (options, seed).

The task around them (`python train.py task=probe probe=<name> model=<scheme>`, conf/task/probe.yaml
and conf/probe/<name>.yaml): `datamodule.py` (splits and the trivial baseline per split),
`network.py` (a small encoder with the scheme in every layer), `module.py` (loss and metrics).
"""

from tasks.probe import clusters, coverage, listops, recall, retrieval
from tasks.probe.data import ProbeData

GENERATORS = {
    "recall": recall.generate,
    "coverage": coverage.generate,
    "clusters": clusters.generate,
    "retrieval": retrieval.generate,
    "listops": listops.generate,
}

__all__ = ["GENERATORS", "ProbeData"]

"""Probe tasks: small generated tasks where the mechanisms the papers argue about decide the answer.

One module per probe, each with `generate(n, seed, **options) -> ProbeData` (tasks/probe/data.py):
    recall      associative recall (Zoology's MQAR), with duplicate and distractor keys
    clusters    unbalanced clusters of points: count them, or find the minority's centre
    retrieval   an ordered tuple read at several marked positions: one head per position
    listops     ListOps (the Long Range Arena's rules) at reduced length
    unmatched   the one object of a list that another lacks: explaining away (DNAS)
    hub         many queries asking one key: the cost of normalizing over queries
    assignment  queries matched with keys by rank: the 1-D optimal transport plan (Sinkhorn)
(coverage, the count of every token type, is retired: uniform attention solves it exactly.)
No download: the data are a function of (options, seed).

The task around them (`python train.py task=probe probe=<name> model=<scheme>`, conf/task/probe.yaml
and conf/probe/<name>.yaml): `datamodule.py` (splits and the trivial baseline per split),
`network.py` (a small encoder with the scheme in every layer), `module.py` (loss and metrics).
"""

from tasks.probe import assignment, clusters, hub, listops, recall, retrieval, unmatched
from tasks.probe.data import ProbeData

GENERATORS = {
    "recall": recall.generate,
    "clusters": clusters.generate,
    "retrieval": retrieval.generate,
    "listops": listops.generate,
    "unmatched": unmatched.generate,
    "hub": hub.generate,
    "assignment": assignment.generate,
}

__all__ = ["GENERATORS", "ProbeData"]

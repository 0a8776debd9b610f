"""Probe tasks: small generated tasks where the mechanisms the papers argue about decide the answer.

A probe is a generator and a config: `generators/<generator>.py` with
`generate(n, seed, **options) -> ProbeData` (tasks/probe/data.py; every module of `generators/`
is discovered, see its docstring for the list), and `conf/probe/<name>.yaml` naming it with its
options, sizes, network and what attnlab.compare tests on it (docs/tasks.md, "A new probe").
(coverage, the count of every token type, is retired: uniform attention solves it exactly.)
No download: the data are a function of (options, seed).

The task around them (`python train.py task=probe probe=<name> model=<scheme>`, conf/task/probe.yaml
and conf/probe/<name>.yaml): `datamodule.py` (splits and the trivial baseline per split),
`network.py` (a small encoder with the scheme in every layer), `module.py` (loss and metrics).
`GENERATORS` ({generator name: its generate}, discovered) is `tasks.probe.generators.GENERATORS`.
"""

from tasks.probe.data import ProbeData
from tasks.probe.generators import GENERATORS

__all__ = ["GENERATORS", "ProbeData"]

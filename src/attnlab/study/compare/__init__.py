"""`python -m attnlab.compare`: which scheme wins where, on probes built so that one mechanism
decides the answer (docs/compare.md).

    probes.py    what compare knows of a probe: its config's `probe.compare` node
    plan.py      the stages: learning rates, pilot and seeds for power, the rest
    analysis.py  records -> cells, the primary family, the controls, exploratory contrasts
    writeup.py   REPORT.md, the figures, the W&B run
    cli.py       the command
"""

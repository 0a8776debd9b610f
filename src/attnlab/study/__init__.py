"""The drivers that train runs and say what they show, one machinery (docs/compare.md,
docs/reproducing.md):

    evidence.py   the shared leaf: Run, a finished run's record (load_jobs), ClaimResult and the
                  verdicts, the machine; what a task's own claim imports, with the
                  statistics below (leaves too: stats, power, learned)
    stats.py      the statistics: intervals, paired tests, TOST, probability of improvement,
                  Holm, the verdicts
    power.py      planning: a contrast's power, the seeds it needs
    learned.py    did a run learn: beat its trivial baseline (by a margin, by a binomial test)
    launch.py     train runs through train.py: Hydra multiruns side by side, reuse, progress
    report.py     `python -m attnlab.report`: a sweep's table
    compare/      `python -m attnlab.compare`: the probes, the primary family, the controls
    reproduce/    `python -m attnlab.reproduce`: the papers' claims and their verdicts

`python -m attnlab.report|compare|reproduce` are the commands (attnlab/report.py, compare.py,
reproduce.py: entry points only).
"""

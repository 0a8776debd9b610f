"""The drivers that train runs and say what they show, one machinery (docs/compare.md,
docs/reproducing.md):

    evidence.py   the shared leaf: Run, a finished run's record (load_jobs), ClaimResult and the
                  verdicts, the machine; what a task's own claim imports, with stats.py
    stats.py      the statistics: intervals, paired tests, TOST, power, Holm, did it learn
    launch.py     train runs through train.py: Hydra multiruns side by side, reuse, progress
    report.py     `python -m attnlab.report`: a sweep's table
    compare/      `python -m attnlab.compare`: the probes, the primary family, the controls
    reproduce/    `python -m attnlab.reproduce`: the papers' claims and their verdicts

`python -m attnlab.report|compare|reproduce` are the commands (attnlab/report.py, compare.py,
reproduce.py: entry points only).
"""

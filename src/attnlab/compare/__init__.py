"""`python -m attnlab.compare`: every attention scheme x every probe task x seeds, trained
through train.py, reported with honest statistics (docs/compare.md).

    plan.py      what is trained: schemes and probes discovered from conf/, modes, resume
    launch.py    the sweeps, side by side, under a progress bar (attnlab.reproduce's launcher)
    cells.py     records -> cells: mean ± s.e., did it learn, the paired verdict against UNAS
    writeup.py   REPORT.md, heatmap.png, the W&B run
"""

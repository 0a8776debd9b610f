"""`python -m attnlab.reproduce`: the papers' claims as small experiments, one command, one report.

    python -m attnlab.reproduce                       # --quick: every claim, short runs
    python -m attnlab.reproduce --full                # the tasks' CPU defaults, 3 seeds (hours)
    python -m attnlab.reproduce --gpu                 # the paper presets (experiment=...) on hardware=gpu
    python -m attnlab.reproduce --claims mode_collapse,explaining_away --tasks probe
    python -m attnlab.reproduce --dry-run             # print the train.py sweeps, run nothing

One module per paper statement, each with NAME, TITLE, PAPER, CLAIM, `runs(plan)` (the training
runs it needs) and `evaluate(plan, results, out_dir)` (its attnlab.study.evidence.ClaimResult:
holds / contradicted / not tested with its reason): the library's (`mode_collapse`,
`explaining_away`, `hnas_u`, `coda_diversity`, `repulsive_diversity`, and the length claims
`length_ssmax`, `length_stickbreaking`, `length_gate`, which plan their seeds from a pilot and
ask for the rest with `more_runs(plan, results)`) and a task's own
(`multiview_vqa`: tasks/vqa/claim.py), found by `registry.claims()` from the task cards
(conf/task/*.yaml), which also say which tasks enter a claim and with which settings. A claim
judged on a probe uses compare's machinery (`probe_evidence.py`). The runs are trained by train.py
itself (attnlab.study.launch), shared between claims, and the report goes to
`reproduce/<time>/REPORT.md` with the PNGs beside it (and to W&B with --wandb).
"""

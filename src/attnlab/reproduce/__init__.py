"""`python -m attnlab.reproduce`: the papers' claims as small experiments, one command, one report.

    python -m attnlab.reproduce                       # --quick: every claim, short runs (<= 15 min on 2 cores)
    python -m attnlab.reproduce --full                # the tasks' CPU defaults, 3 seeds (hours)
    python -m attnlab.reproduce --gpu                 # the paper presets (experiment=...) on hardware=gpu
    python -m attnlab.reproduce --claims mode_collapse,explaining_away --tasks vqa
    python -m attnlab.reproduce --dry-run             # print the train.py sweeps, run nothing

One module per claim (`mode_collapse`, `explaining_away`, `multiview_vqa`, `hnas_u`,
`head_diversity`), each with `runs(plan)` (the training runs it needs) and `evaluate(plan,
results, out_dir)` (its ClaimResult). The runs are trained by train.py itself (Hydra multiruns,
`launch.py`), shared between claims, and the report goes to `reproduce/<time>/REPORT.md` with
the PNGs beside it (and to W&B with --wandb).
"""

from attnlab.reproduce import explaining_away, head_diversity, hnas_u, mode_collapse, multiview_vqa

CLAIMS = {m.NAME: m for m in (mode_collapse, explaining_away, multiview_vqa, hnas_u, head_diversity)}

__all__ = ["CLAIMS"]

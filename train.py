"""Train and test one configuration, or a sweep with -m.

    python train.py model=hnas task=vqa
    python train.py -m model=unas,dnas,hnas task=vqa seed=1,2,3
    python train.py --help          # every config group and option

Exit codes: 0 done, 2 a configuration or data error (one line on stderr), 143 preempted (SIGTERM)
and 130 stopped (Ctrl-C, SIGINT), both with checkpoints/last.ckpt written when it came during
training, 1 a bug (with its traceback).
"""

import os

# `tasks` is importable without any path edit: Python puts this script's folder first on sys.path
# (and `pip install -e .` installs it too)
ROOT = os.path.dirname(os.path.abspath(__file__))
os.environ.setdefault("ATTNLAB_ROOT", ROOT)

import hydra
from omegaconf import DictConfig

from attnlab import cli, console
from attnlab.runner import run_job, train


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    console.quiet()  # here, not at import: sweep jobs may run in other processes
    return run_job(train, cfg)


if __name__ == "__main__":
    cli.run(main, os.path.join(ROOT, "conf"))

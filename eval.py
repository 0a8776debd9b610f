"""Evaluate a checkpoint: python eval.py ckpt_path=outputs/<task>/<model>/<run>/checkpoints/last.ckpt

or one logged with logger.wandb.log_model=best: python eval.py ckpt_path=wandb:<entity>/<project>/<artifact>:<alias>
"""

import os
import sys
from pathlib import Path

ROOT = os.path.dirname(os.path.abspath(__file__))  # first on sys.path: `tasks` is importable
os.environ.setdefault("ATTNLAB_ROOT", ROOT)

import hydra
from omegaconf import DictConfig, open_dict

from attnlab import checkpoints, cli, console
from attnlab.evaluation import evaluate
from attnlab.runner import run_job
from attnlab.wandb_runs import WANDB_PREFIX, checkpoint_from_artifact


def evaluate_any(cfg: DictConfig) -> dict:
    if str(cfg.ckpt_path).startswith(WANDB_PREFIX):  # a W&B artifact: download it into this eval's dir
        with open_dict(cfg):
            cfg.ckpt_path = checkpoint_from_artifact(str(cfg.ckpt_path), Path(cfg.paths.output_dir) / "artifacts")
    return evaluate(cfg)


@hydra.main(version_base="1.3", config_path="conf", config_name="eval")
def main(cfg: DictConfig) -> None:
    console.quiet()  # the known-harmless third-party messages (attnlab.console)
    run_job(evaluate_any, cfg)


if __name__ == "__main__":
    # the checkpoint's task, so that its own keys can be overridden (task.eval_lengths=[1,4])
    sys.argv += checkpoints.task_argument(sys.argv[1:])
    cli.run(main, os.path.join(ROOT, "conf"))

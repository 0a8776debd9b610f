"""Evaluate a checkpoint: python eval.py ckpt_path=outputs/<task>/<model>/<run>/checkpoints/last.ckpt"""

import os
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))
os.environ.setdefault("ATTNLAB_ROOT", ROOT)
sys.path.insert(0, ROOT)

import hydra
from omegaconf import DictConfig

from attnlab import cli
from attnlab.runner import evaluate, run_job


@hydra.main(version_base="1.3", config_path="conf", config_name="eval")
def main(cfg: DictConfig) -> None:
    run_job(evaluate, cfg)


if __name__ == "__main__":
    cli.run(main, os.path.join(ROOT, "conf"))

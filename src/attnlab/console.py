"""A clean console: progress, the model summary, the results, and warnings that mean something.

The messages below come from our dependencies, are known to be harmless for attnlab runs, and
would bury the rest (a `make train` printed them between the model summary and the results); this
is the one place that drops them, each with why. Causes that were ours are fixed where they are
(checkpoints are saved and loaded with an explicit `weights_only`). Anything not listed here still
reaches the console. tests/e2e/test_console.py runs a tiny training and checks that none appears.
"""

from __future__ import annotations

import logging
import sys
import warnings

# (message regex, category): Python warnings
WARNINGS = (
    # torch 2.13 deprecates `LeafSpec`; Lightning 2.6's own pytree helper (moving batches and
    # outputs between devices) still tests for it. Lightning's to update, nothing we call or pass.
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning),
)
# Lightning logs advertisements of its cloud products ("💡 Tip: ... litlogger / litmodels") on
# every Trainer; they say nothing about the run.
LIGHTNING_TIP = "💡 Tip:"
LIGHTNING_LOGGERS = ("pytorch_lightning.utilities.rank_zero", "lightning_fabric.utilities.rank_zero")
# Lightning's WandbLogger always passes `anonymous` to wandb.init (None when not asked for), and
# wandb 0.31 warns that the setting has no effect whatever its value. We never set it
# (config_args leaves it out of logger.wandb).
WANDB_MESSAGES = ("The anonymous setting has no effect and will be removed in a future version.",)


class _DropLightningTips(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(LIGHTNING_TIP)


def quiet() -> None:
    """Drop the known-harmless messages in this process (train.py and eval.py call it in every
    job, so sweep jobs run in other processes are quiet too). Idempotent."""
    for message, category in WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    for name in LIGHTNING_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropLightningTips) for f in logger.filters):
            logger.addFilter(_DropLightningTips())
    if "wandb" in sys.modules:  # importing wandb costs a second and a half: only once it is used
        quiet_wandb()


def quiet_wandb() -> None:
    """wandb prints a message given with repeat=False only once per process: mark these as said.
    (wandb's terminal output is not Python warnings or logging, so nothing else can filter it.)"""
    from wandb.errors import term

    said, warn = getattr(term, "_printed_messages", None), getattr(term, "WARN_STRING", None)
    if isinstance(said, set) and isinstance(warn, str):  # termwarn's key: the prefixed message
        said.update(f"{warn} {message}" for message in WANDB_MESSAGES)

"""`TaskModule`: the LightningModule every task builds on, with its parts injected by Hydra.

    task:
      module:
        _target_: tasks.vqa.module.VQAModule
        net:          {_target_: tasks.vqa.model.VQAModel, attention: ${model}, hidden_dim: 128, ...}
        optimizer:    {_target_: torch.optim.AdamW, _partial_: true, lr: 1.0e-3, weight_decay: 0.01}
        scheduler:    {_target_: tasks.common.optim.linear_warmup, _partial_: true, warmup: 0.05}  # or null
        hybrid_lr:    null     # the learning rate of the schemes' own parameters (HNAS's u); null: lr

The runner instantiates it with the sizes only the data know merged into the nodes they belong
to (`datamodule.model_kwargs()` returns e.g. `{"net": {"vocab_size": 30522}}`), so each default
is written once, in the YAML, in lightning-hydra-template's manner.

Training rules that add to the loss (MA+R's disagreement) register a term with
`register_loss_term(name, term)`: `training_step` sums the task's own loss and every term, so no
rule ever replaces a module's method. A term is a callable `term(module) -> Tensor | None`
(None: nothing this step), called after the task's forward.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import pytorch_lightning as pl
from torch import Tensor, nn

from attnlab.attention import scheme_parameters

LossTerm = Callable[["TaskModule"], "Tensor | None"]


class TaskModule(pl.LightningModule):
    """Holds `net`, builds the optimizer from its partial, and sums the registered loss terms.

    A task implements `task_loss(batch, batch_idx) -> Tensor` (its training loss, after logging
    what it wants) and its validation/test steps; `training_step` is this class's.
    """

    def __init__(self, net: nn.Module, optimizer: Callable[..., Any], scheduler: Callable | None = None,
                 hybrid_lr: float | None = None) -> None:
        super().__init__()
        # the network is a module (saved in the state dict), not a hyper-parameter
        self.save_hyperparameters(logger=False, ignore=["net"])
        self.net = net
        self._loss_terms: dict[str, LossTerm] = {}

    # ------------------------------------------------------------------ loss terms
    def register_loss_term(self, name: str, term: LossTerm) -> None:
        self._loss_terms[name] = term

    def remove_loss_term(self, name: str) -> None:
        self._loss_terms.pop(name, None)

    def task_loss(self, batch: Any, batch_idx: int) -> Tensor:
        raise NotImplementedError

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        loss = self.task_loss(batch, batch_idx)
        for name, term in self._loss_terms.items():
            value = term(self)
            if value is not None:
                self.log(f"train/{name}", value.detach(), on_step=True, on_epoch=False)
                loss = loss + value
        return loss

    # ------------------------------------------------------------------ optimization
    def parameter_groups(self) -> list[dict]:
        """Decayed matrices, undecayed vectors (biases, norms), and the schemes' own parameters
        (HNAS's u logits, found by type) with `hybrid_lr` and no decay: decay would pull u to 0.5."""
        opt = self.hparams.optimizer
        keywords = opt.keywords if isinstance(opt, partial) else getattr(opt, "keywords", {}) or {}
        decay = float(keywords.get("weight_decay", 0.0))
        hybrid = [p for _, p in scheme_parameters(self) if p.requires_grad]
        ids = {id(p) for p in hybrid}
        rest = [p for p in self.parameters() if p.requires_grad and id(p) not in ids]
        groups = [{"params": [p for p in rest if p.dim() >= 2], "weight_decay": decay},
                  {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0}]
        if hybrid:
            group = {"params": hybrid, "weight_decay": 0.0}
            if self.hparams.hybrid_lr is not None:
                group["lr"] = float(self.hparams.hybrid_lr)
            groups.append(group)
        return [g for g in groups if g["params"]]

    def configure_optimizers(self) -> Any:
        optimizer = self.hparams.optimizer(params=self.parameter_groups())
        if self.hparams.scheduler is None:
            return optimizer
        scheduler = self.hparams.scheduler(optimizer=optimizer)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

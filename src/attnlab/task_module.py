"""`TaskModule`: the LightningModule every task builds on, with its parts injected by Hydra.

    task:
      module:
        _target_: tasks.vqa.module.VQAModule
        net:          {_target_: tasks.vqa.model.VQAModel, attention: ${model}, hidden_dim: 128, ...}
        optimizer:    {_target_: torch.optim.AdamW, _partial_: true, lr: 1.0e-3, weight_decay: 0.01}
        scheduler:    {_target_: tasks.common.optim.linear_schedule, _partial_: true, warmup: 0.05}  # or null

The schemes' own parameters (HNAS's u, a sink's b: what any scheme module holds directly) train
at their scheme's `model.param_lr`, without weight decay (`parameter_groups`).

The runner instantiates it with `build_module(cfg.task.module, datamodule.model_kwargs())`: the
sizes only the data know go into the nodes that take them (a nested `{"net": {...}}` as given; a
flat key to the module and/or the net, whichever constructor names it), so each default is
written once, in the YAML, in lightning-hydra-template's manner.

A scheduler partial that names `total_steps` gets `trainer.estimated_stepping_batches`; it steps
every optimizer step unless the task says otherwise (`lr_scheduler_config`). Checkpoints written
before the injected network (its weights under `model.*`) load into `net.*` (on_load_checkpoint).

Training rules that add to the loss (MA+R's disagreement) register a term with
`register_loss_term(name, term)`: `training_step` sums the task's own loss and every term, so no
rule ever replaces a module's method. A term is a callable `term(module) -> Tensor | None`
(None: nothing this step), called after the task's forward.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import hydra
import pytorch_lightning as pl
from hydra.errors import InstantiationException
from omegaconf import DictConfig
from torch import Tensor, nn

from attnlab.attention.schemes import named_scheme_modules
from attnlab.checkpoints import upgrade_state_dict
from attnlab.errors import ConfigError, DataError
from attnlab.fsdp import built_dims, clip_grad_norm

LossTerm = Callable[["TaskModule"], "Tensor | None"]


class TaskModule(pl.LightningModule):
    """Holds `net`, builds the optimizer from its partial, and sums the registered loss terms.

    A task implements `task_loss(batch, batch_idx) -> Tensor` (its training loss, after logging
    what it wants) and its validation/test steps; `training_step` is this class's.
    """

    def __init__(self, net: nn.Module, optimizer: Callable[..., Any],
                 scheduler: Callable | None = None) -> None:
        super().__init__()
        # the network is a module (saved in the state dict), not a hyper-parameter
        self.save_hyperparameters(logger=False, ignore=["net"])
        self.net = net
        self._loss_terms: dict[str, LossTerm] = {}
        self._built_dims: dict[int, int] = {}

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
    def setup(self, stage: str) -> None:
        # before the strategy wraps the model: FSDP flattens every parameter to 1-D
        self._built_dims.update(built_dims(self))

    def parameter_groups(self) -> list[dict]:
        opt = self.hparams.optimizer
        keywords = opt.keywords if isinstance(opt, partial) else getattr(opt, "keywords", {}) or {}
        return parameter_groups(self, float(keywords.get("weight_decay", 0.0)), dims=self._built_dims)

    def configure_optimizers(self) -> Any:
        optimizer = self.hparams.optimizer(params=self.parameter_groups())
        if self.hparams.scheduler is None:
            return optimizer
        make = self.hparams.scheduler
        extra = {}
        if "total_steps" in inspect.signature(make).parameters:
            extra["total_steps"] = max(1, int(self.trainer.estimated_stepping_batches))
        return {"optimizer": optimizer, "lr_scheduler": self.lr_scheduler_config(make(optimizer, **extra))}

    def lr_scheduler_config(self, scheduler: Any) -> dict:
        """Lightning's scheduler config; a task whose scheduler steps otherwise overrides it."""
        return {"scheduler": scheduler, "interval": "step"}

    def configure_gradient_clipping(self, optimizer: Any, gradient_clip_val: float | None = None,
                                    gradient_clip_algorithm: str | None = None) -> None:
        if gradient_clip_val and gradient_clip_algorithm in (None, "norm") and clip_grad_norm(self, gradient_clip_val):
            return  # FSDP: the norm over every rank's shard
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

    # ------------------------------------------------------------------ checkpoints
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if "state_dict" in checkpoint:  # FSDP has loaded the weights already, and taken them out
            checkpoint["state_dict"] = upgrade_state_dict(checkpoint["state_dict"])


def parameter_groups(model: nn.Module, weight_decay: float, lr: float | None = None,
                     dims: Mapping[int, int] | None = None) -> list[dict]:
    """Optimizer groups, one rule for every parameter: the schemes' own parameters (those every
    scheme module holds directly, whatever its kind: HNAS's u logits, a sink's b, diff's lambda
    vectors; `SchemeModule.scheme_parameters`) without decay, one group per scheme learning rate
    (the scheme's `param_lr`, `model.param_lr`; None: `lr`, or the optimizer's when that is None
    too); every other parameter decayed iff it is a matrix (>= 2-D, nanoGPT's rule: biases and
    norms are not).

    No decay on the schemes' own: it would pull u towards 0.5 (a sink's b towards 0) and bias the
    scheme. A larger param_lr gives these few parameters room to move in a short run: Adam moves
    a parameter by at most about lr per step whatever its gradient's scale, so at lr 1e-3 with
    warmup and decay a logit moves < 0.3 in a 500-step CPU run, while the paper's 125k steps allow
    ~100.

    `dims`: each parameter's number of dimensions as built, by id (`attnlab.fsdp.built_dims`),
    for a model FSDP has flattened; without it, the parameters' own.
    """
    by_rate: dict[float | None, list[nn.Parameter]] = {}
    for _, module in named_scheme_modules(model):
        own = [p for p in module.scheme_parameters() if p.requires_grad]
        if own:
            by_rate.setdefault(lr if module.param_lr is None else module.param_lr, []).extend(own)
    ids = {id(p) for params in by_rate.values() for p in params}
    rest = [p for p in model.parameters() if p.requires_grad and id(p) not in ids]
    matrix = {id(p) for p in rest if (dims or {}).get(id(p), p.dim()) >= 2}
    groups = [{"params": [p for p in rest if id(p) in matrix], "weight_decay": weight_decay},
              {"params": [p for p in rest if id(p) not in matrix], "weight_decay": 0.0}]
    for rate, params in by_rate.items():
        group = {"params": list({id(p): p for p in params}.values()), "weight_decay": 0.0}
        if rate is not None:
            group["lr"] = float(rate)
        groups.append(group)
    return [g for g in groups if g["params"]]


def build_module(cfg: DictConfig, data_kwargs: Mapping[str, Any]) -> TaskModule:
    """Instantiate a `task.module` node with the sizes only the data know (`model_kwargs()`).

    A nested dict (`{"net": {...}}`) goes into that node; a flat key goes to the module and to
    the net, whichever constructors name it (both when both do); one that neither takes is
    information this task does not use (lm's word_level). A part's own ConfigError or DataError
    comes out as it raised it, not wrapped by Hydra.
    """
    module_takes = _arguments(cfg._target_)
    net = cfg.get("net")
    net_takes = _arguments(net._target_) if isinstance(net, Mapping) and "_target_" in net else set()
    top: dict[str, Any] = {}
    nested: dict[str, dict] = {}
    for key, value in data_kwargs.items():
        if isinstance(value, Mapping) and isinstance(cfg.get(key), Mapping):
            nested.setdefault(key, {}).update(value)
            continue
        if key in module_takes:
            top[key] = value
        if key in net_takes:
            nested.setdefault("net", {})[key] = value
    try:
        return hydra.utils.instantiate(cfg, **top, **nested)
    except InstantiationException as err:  # a part's own ConfigError/DataError, as it raised it
        cause = err.__cause__
        while isinstance(cause, InstantiationException):
            cause = cause.__cause__
        if isinstance(cause, (ConfigError, DataError)):
            raise cause from None
        raise


def _arguments(target: str) -> set[str]:
    """The names a target takes; a class whose __init__ hands **kwargs on (a thin task subclass,
    e.g. HeadlineModule) takes its bases' too."""
    found = hydra.utils.get_class(str(target))
    names: set[str] = set()
    for cls in found.__mro__ if isinstance(found, type) else (found,):
        params = inspect.signature(cls.__init__ if isinstance(found, type) else cls).parameters
        names |= {n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            break
    return names - {"self"}

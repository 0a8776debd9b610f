"""FSDP (`hardware=fsdp`): a model sharded across GPUs, for one that outgrows a GPU.

Lightning's `FSDPStrategy` with attnlab's choices: the units it shards are the encoder layers
(`layer_policy`: each one's parameters are gathered only while it runs), fit and test share one
root unit, and it also runs on the CPU with gloo (`hardware=fsdp_cpu`, 2 processes), so the FSDP
path (flattened parameters, full-state checkpoints, resume) is tested without GPUs as `ddp_cpu`
tests DDP's. Lightning refuses FSDP on the CPU, but torch's FSDP runs there when given the CPU as
its device. On the CPU torch 2.13 saves Adam's first moments wrongly (equal to the second
moments): a resumed fsdp_cpu run has the exact weights, not the exact optimizer state
(docs/running.md, Scale-out).

Outside a unit's forward each parameter is a flat 1-D view of this rank's shard (use_orig_params
keeps the Parameter objects): `full_parameters(module)` gathers them for code that reads them
between forwards (the scheme parameters a run reports).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytorch_lightning as pl
from torch import nn
from torch.distributed.fsdp import (
    FullOptimStateDictConfig,
    FullStateDictConfig,
    FullyShardedDataParallel,
    StateDictType,
)
from torch.distributed.fsdp.wrap import CustomPolicy

from attnlab.attention.layers import TransformerEncoderLayer


def own_unit(module: nn.Module) -> bool:
    """Whether `module` is an FSDP unit of its own: each transformer layer that only ever runs
    through its forward. A unit gathers its parameters in its forward alone, and decoding calls
    decoder layers' and causal layers' `step` outside it (headline, mt, lm): those stay in the
    root unit, gathered whenever the network runs."""
    return isinstance(module, TransformerEncoderLayer) and not module.causal


def layer_policy() -> CustomPolicy:
    """One FSDP unit per encoder layer (`own_unit`); the rest of a network (embeddings, heads,
    decoders, VQA's fusion) is in the root unit."""
    return CustomPolicy(own_unit)


class FSDPStrategy(pl.strategies.FSDPStrategy):
    """Lightning's FSDPStrategy, which on the CPU hands torch's FSDP the CPU as its device (its
    own passes None, and torch then asks for an accelerator). Lightning's check that refuses FSDP
    on the CPU tests for its class exactly, so this subclass passes it."""

    _root: FullyShardedDataParallel | None = None

    def _setup_model(self, model: nn.Module) -> nn.Module:
        # trainer.test after trainer.fit hands over the module without the root unit that fit
        # wrapped around it, whose parameters stay flattened: Lightning would leave them so
        # (the layers are FSDP units already) and test on shards. The same root serves again.
        if self._root is not None and self._root.module is model:
            return self._root
        if self.root_device.type != "cpu" or any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
            self._root = super()._setup_model(model)
        else:
            self._root = FullyShardedDataParallel(module=model, cpu_offload=self.cpu_offload,
                                                  mixed_precision=self.mixed_precision_config,
                                                  sharding_strategy=self.sharding_strategy,
                                                  device_id=self.root_device, **self.kwargs)
        return self._root

    # On the CPU a full state dict "offloaded to the CPU" (Lightning's setting for saving and
    # loading) crashes torch 2.13's FSDP (a segfault cloning freed memory): there it is gathered
    # without the offload.
    def lightning_module_state_dict(self) -> dict[str, Any]:
        with self._gathered_in_place():
            return super().lightning_module_state_dict()

    def optimizer_state(self, optimizer: Any) -> dict[str, Any]:
        with self._gathered_in_place():
            return super().optimizer_state(optimizer)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        with self._gathered_in_place():
            return super().load_checkpoint(checkpoint_path, weights_only=weights_only)

    @contextlib.contextmanager
    def _gathered_in_place(self) -> Iterator[None]:
        if self.root_device.type != "cpu":
            yield
            return
        from lightning_fabric.strategies import model_parallel
        from pytorch_lightning.strategies import fsdp as lightning_fsdp

        def in_place(module: nn.Module, world_size: int, rank0_only: bool = True) -> Any:
            return FullyShardedDataParallel.state_dict_type(
                module, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=rank0_only),
                FullOptimStateDictConfig(rank0_only=rank0_only))

        users = (lightning_fsdp, model_parallel)  # saving; loading the weights
        offloading = [user._get_full_state_dict_context for user in users]
        for user in users:
            user._get_full_state_dict_context = in_place
        try:
            yield
        finally:
            for user, original in zip(users, offloading):
                user._get_full_state_dict_context = original


@contextlib.contextmanager
def full_parameters(module: nn.Module) -> Iterator[None]:
    """Every parameter of `module` whole while inside (a no-op without FSDP units). For a
    LightningModule it is the strategy's root unit that wraps it. A collective: every rank must
    enter it, between forwards."""
    trainer = getattr(module, "_trainer", None)  # a LightningModule attached to a Trainer
    root = getattr(trainer.strategy, "model", None) if trainer is not None else None
    root = root if isinstance(root, FullyShardedDataParallel) else module
    if not any(isinstance(m, FullyShardedDataParallel) for m in root.modules()):
        yield
        return
    with FullyShardedDataParallel.summon_full_params(root, writeback=False):
        yield


def clip_grad_norm(module: nn.Module, max_norm: float) -> bool:
    """Clip the gradients' norm over every rank's shard (Lightning's own clipping refuses FSDP);
    False without FSDP, for the caller to clip as usual."""
    trainer = getattr(module, "_trainer", None)
    root = getattr(trainer.strategy, "model", None) if trainer is not None else None
    if not isinstance(root, FullyShardedDataParallel):
        return False
    root.clip_grad_norm_(max_norm)
    return True


def built_dims(module: nn.Module) -> dict[int, int]:
    """Each parameter's number of dimensions as built, by id: FSDP flattens them before the
    optimizer is made, and the dims decide weight decay (`task_module.parameter_groups`)."""
    return {id(p): p.dim() for p in module.parameters() if not getattr(p, "_fsdp_flattened", False)}


__all__ = ["FSDPStrategy", "built_dims", "clip_grad_norm", "full_parameters", "layer_policy", "own_unit"]

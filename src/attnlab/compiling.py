"""`compile=true`: the task's network under `torch.compile` (docs/running.md, torch.compile).

The runner calls `compile_net` once, after building the LightningModule: the network it holds
(`module.net`) is compiled in place with `nn.Module.compile`, so its state dict and checkpoints
keep their keys and the LightningModule around it (steps, logging, loss terms) stays eager.
A network whose task calls methods other than `forward` lists them in `compile_methods`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytorch_lightning as pl

# torch.compile's modes, which `compile=` takes besides true / false (config_schema checks it)
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def compile_net(module: pl.LightningModule, setting: bool | str, backend: str = "inductor") -> None:
    """Compile `module.net` in place (setting: false, true, or one of `MODES`; `backend`: the
    compiler, inductor for runs; the default test's recompile check takes aot_eager, the same
    dynamo and AOT autograd graphs and guards without inductor's code generation, which is
    most of a compile's time, and which only the slow each-task test then exercises).

    dynamic=True: batch sizes and sequence lengths are symbolic from the first call, so a new
    length never recompiles; a training step and a validation step (grad mode, dropout) compile
    a graph each. attnlab's kernels are torch ops with fake implementations (kernels/fused.py,
    rowwise.py, triton_ops.py) and the CUDA kernel choice is a constant to the compiler
    (attention/paths.py). Whether the fused CPU kernel is built is asked here, eagerly, once
    (where no GPU is: it builds it, as the first eager call would): traced, the build would
    break the graph at every attention call that asks (kernels/fused.py, `load`).
    """
    if setting is False:
        return
    import torch

    from attnlab.attention.kernels import fused

    if not torch.cuda.is_available():
        fused.load()

    options = {"mode": None if setting is True else setting, "dynamic": True, "backend": backend}
    net = module.net
    net.compile(**options)
    # a network whose task calls other methods than forward names them (Seq2SeqTransformer's
    # forward_hidden, which its target_logits runs): compiled too, on the instance
    for name in getattr(net, "compile_methods", ()):
        setattr(net, name, torch.compile(getattr(net, name), **options))

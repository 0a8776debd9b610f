"""attnlab.fsdp on two CPU processes (gloo): what FSDP changes for attnlab's code, checked against
the same network unwrapped. The whole run (train, checkpoint, resume) through the CLI:
tests/e2e/test_cli.py::test_fsdp_cpu_trains_checkpoints_and_resumes (slow)."""

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from attnlab.attention import TransformerEncoderLayer, run_stack, scheme_values
from attnlab.fsdp import built_dims, full_parameters, layer_policy
from attnlab.task_module import parameter_groups

SPEC = {"name": "hnas", "scheme": "hnas", "hybrid_init": 0.3, "hybrid_per": "head", "param_lr": 0.05}


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 16)
        self.layers = nn.ModuleList(TransformerEncoderLayer(16, 2, 32, dropout=0.0, spec=SPEC, layer_index=i)
                                    for i in range(2))
        self.head = nn.Linear(16, 3)

    def forward(self, tokens):
        return self.head(run_stack(self.layers, self.embed(tokens)))


def _worker(rank: int, port: int) -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        plain = Stack()
        with torch.no_grad():  # u apart per layer and head, so a shard could not pass for it
            for i, layer in enumerate(plain.layers):
                layer.self_attn.normalizer.hybrid_logit.copy_(torch.tensor([0.1, -0.7]) * (i + 1))
        model = Stack()
        model.load_state_dict(plain.state_dict())
        dims = built_dims(model)
        model = FSDP(model, auto_wrap_policy=layer_policy(), use_orig_params=True, device_id=torch.device("cpu"))
        # one unit per transformer layer, and the root
        assert sum(isinstance(m, FSDP) for m in model.modules()) == 3
        # FSDP has flattened every parameter; the groups still decay exactly the built matrices
        assert all(p.dim() == 1 for p in model.parameters())
        groups = parameter_groups(model, weight_decay=0.1, lr=1e-3, dims=dims)
        matrices = {n for n, p in plain.named_parameters() if p.dim() >= 2}
        names = {id(p): n.replace("_fsdp_wrapped_module.", "") for n, p in model.named_parameters()}
        assert {names[id(p)] for p in groups[0]["params"]} == matrices and groups[0]["weight_decay"] == 0.1
        own = [g for g in groups if g.get("lr") == 0.05]
        assert len(own) == 1 and {names[id(p)].rpartition(".")[2] for p in own[0]["params"]} == {"hybrid_logit"}
        # outside a forward a rank holds a shard of u; inside full_parameters, all of it, by the plain names
        with full_parameters(model):
            seen = scheme_values(model)["hnas_u"]
        expected = scheme_values(plain)["hnas_u"]
        assert list(seen) == list(expected) == ["layers.0.self_attn", "layers.1.self_attn"]
        for name in expected:
            torch.testing.assert_close(seen[name], expected[name])
        # and the forward is the plain network's
        tokens = torch.randint(0, 11, (2, 5))
        torch.testing.assert_close(model(tokens), plain(tokens))
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_fsdp_units_groups_and_scheme_values_on_two_cpu_processes():
    # fork: the processes start with this one's imports (spawn re-imports Lightning: ~10 s more)
    mp.start_processes(_worker, args=(free_port(),), nprocs=2, start_method="fork")


def test_hardware_fsdp_builds_the_strategy_with_the_layer_policy(tmp_path):
    """conf/hardware/fsdp.yaml as the runner instantiates it (on a machine without GPUs, its
    strategy alone): attnlab's strategy, one unit per transformer layer, full-state checkpoints."""
    from helpers.paths import ROOT
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from attnlab import config_args
    from attnlab.attention import TransformerDecoderLayer
    from attnlab.fsdp import FSDPStrategy

    config_args.register(ROOT / "conf")
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=["hardware=fsdp", f"paths.output_dir={tmp_path}"])
    assert (cfg.trainer.accelerator, cfg.trainer.devices, cfg.trainer.precision) == ("gpu", -1, "bf16-mixed")
    strategy = instantiate(cfg.trainer.strategy)
    assert isinstance(strategy, FSDPStrategy) and strategy._state_dict_type == "full"
    assert strategy.kwargs["use_orig_params"] is True
    policy = strategy.kwargs["auto_wrap_policy"]._lambda_fn
    # encoder layers are units; decoders' and causal layers' `step` runs outside their forward
    # (decoding), so they stay in the root unit
    assert policy(TransformerEncoderLayer(16, 2, 32)) is True
    assert policy(TransformerEncoderLayer(16, 2, 32, causal=True)) is False
    assert policy(TransformerDecoderLayer(16, 2, 32)) is False

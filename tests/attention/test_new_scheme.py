"""The worked examples of docs/attention.md, "A new scheme", run from the page itself: a softmax
with a learned per-head temperature (a normalization) and talking heads (a logit transform), each
its two files and nothing else. Registered here at run time (as its file in schemes/ would be on
import), each runs in a stack of layers, its own parameter trains at its `param_lr` without weight
decay, and it is reported per head wherever the schemes' parameters are (`scheme_values`, the run
summary's `scheme_params`, the plots' label)."""

from __future__ import annotations

import importlib.util
import math
import re
import sys
import types

import pytest
import torch
import yaml
from helpers.paths import ROOT
from torch import nn

from attnlab.attention import (
    AttentionSpec,
    TransformerEncoderLayer,
    attend,
    run_stack,
    scheme_values,
)
from attnlab.attention.schemes import reported_label, unregister
from attnlab.run_record import scheme_params
from attnlab.task_module import parameter_groups

PAGE = ROOT / "docs" / "attention.md"


def example(path: str, name: str) -> str:
    """The indented block after the line of the page that ends "`<path>` ... `<name>`:" (the page
    names the files `schemes/<name>.py` and `<name>.yaml`, with the example's name)."""
    lines = PAGE.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.endswith(f"= `{name}`:")
                 and f"`{path}`" in lines[i - 1] + line)
    block = []
    for line in lines[start + 1:]:
        if line and not line.startswith("    "):
            break
        block.append(line[4:])
    return "\n".join(block).strip() + "\n"


@pytest.fixture
def registered(tmp_path):
    """Imports the page's scheme file as a module of the schemes package would be imported (its
    `@register` registers it); unregisters it afterwards."""
    names = []

    def load(name: str) -> types.ModuleType:
        file = tmp_path / f"{name}.py"
        file.write_text(example("src/attnlab/attention/schemes/<name>.py", name))
        spec = importlib.util.spec_from_file_location(f"attnlab.attention.schemes.{name}", file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # as an import does (dataclasses look it up)
        names.append(name)
        spec.loader.exec_module(module)
        return module

    yield load
    for name in names:
        unregister(name)
        sys.modules.pop(f"attnlab.attention.schemes.{name}", None)


def stack(spec: AttentionSpec, layers: int = 2) -> nn.ModuleList:
    torch.manual_seed(0)
    return nn.ModuleList(TransformerEncoderLayer(16, 4, 32, 0.0, spec, layer_index=i) for i in range(layers))


def config(name: str, **overrides) -> AttentionSpec:
    cfg = yaml.safe_load(example("conf/model/<name>.yaml", name))
    assert cfg["name"] == cfg["scheme"] == name
    return AttentionSpec.from_config({**cfg, **overrides})


def own_group(layers: nn.Module, parameter: nn.Parameter) -> dict:
    [group] = [g for g in parameter_groups(layers, weight_decay=0.1, lr=1e-3)
               if any(p is parameter for p in g["params"])]
    return group


def test_a_learned_temperature_is_about_25_lines_and_trains_undecayed_and_reported(registered):
    code = example("src/attnlab/attention/schemes/<name>.py", "tempered")
    assert len([line for line in code.splitlines() if line.strip()]) <= 27
    registered("tempered")
    spec = config("tempered", param_lr=0.05, temperature_init=2.0)
    layers = stack(spec)
    x = torch.randn(2, 7, 16)
    padding = torch.zeros(2, 7, dtype=torch.bool)
    padding[1, -2:] = True
    run_stack(layers, x, padding).square().sum().backward()
    log_t = layers[1].self_attn.normalizer.log_t
    assert log_t.shape == (4,) and log_t.grad is not None and log_t.grad.abs().sum() > 0
    assert own_group(layers, log_t) == {"params": [layers[0].self_attn.normalizer.log_t, log_t],
                                        "weight_decay": 0.0, "lr": 0.05}
    values = scheme_values(layers)["tempered_t"]
    assert list(values) == ["0.self_attn", "1.self_attn"]
    torch.testing.assert_close(values["1.self_attn"], torch.full((4,), 2.0))
    assert scheme_params(layers)["tempered_t"]["0.self_attn"] == [2.0] * 4
    assert reported_label("tempered_t") == "tempered t"
    # the functional form, given t: softmax(s / t) over the valid keys
    q, k, v = (torch.randn(1, 2, 5, 8, dtype=torch.float64) for _ in range(3))
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8) / 3.0, -1)
    torch.testing.assert_close(attend(q, k, v, "tempered", t=3.0), weights @ v, atol=1e-12, rtol=0)


def test_talking_heads_is_two_files_and_its_matrix_trains_undecayed_and_reported(registered):
    registered("talking_heads")
    spec = config("talking_heads", param_lr=0.02)
    layers = stack(spec)
    assert not spec.cascades and all(layer.self_attn.transform.name == "talking_heads" for layer in layers)
    mix = layers[0].self_attn.transform.mix
    with torch.no_grad():
        mix.copy_(torch.eye(4) + 0.1 * torch.randn(4, 4))
    x = torch.randn(2, 7, 16)
    run_stack(layers, x, None).square().sum().backward()
    assert mix.grad is not None and mix.grad.abs().sum() > 0
    group = own_group(layers, mix)
    assert group["weight_decay"] == 0.0 and group["lr"] == 0.02 and len(group["params"]) == 2
    torch.testing.assert_close(scheme_values(layers)["talking_heads_self_weight"]["0.self_attn"],
                               torch.diagonal(mix).detach())
    # the logits are mixed across heads, then the normalization's softmax
    attention = layers[0].self_attn
    q, k, v = (torch.randn(1, 4, 6, 4) for _ in range(3))
    out, _ = attention.attend_heads(q, k, v)
    mixed = torch.einsum("gh,bhqk->bgqk", mix.detach(), q @ k.transpose(-2, -1) / 2.0)
    torch.testing.assert_close(out, torch.softmax(mixed, -1) @ v, atol=1e-6, rtol=0)


def test_a_reported_parameter_that_is_not_per_head_is_refused_where_it_is_declared():
    from attnlab.attention.schemes import SchemeModule

    class Matrix(SchemeModule):
        name = "test_matrix"

    module = Matrix(None, 3)
    with pytest.raises(ValueError, match=re.escape("own parameter 'm' is reported as shape (3, 3), "
                                                   "not one value per head (3)")):
        module.own("m", torch.eye(3), report="m")
    assert not hasattr(module, "m")  # refused before it was registered
    module.own("d", torch.eye(3), report="d", shown=torch.diagonal)
    module.plain = nn.Parameter(torch.zeros(2))  # held directly, not declared: its own, not reported
    assert module.scheme_parameters() == [module.d, module.plain]
    assert list(module.reported()) == ["d"]
    torch.testing.assert_close(module.reported()["d"], torch.ones(3))

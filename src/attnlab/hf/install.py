"""`use_scheme(model, "hnas", **options)`: every attention of a loaded `transformers` model runs an
attnlab scheme; `from_pretrained(cls, path)`: load such a model back with its scheme.

The attention modules are those whose forward dispatches through transformers'
`ALL_ATTENTION_FUNCTIONS` (every model of transformers 5 that supports `attn_implementation`).
Each gets a `SchemeAttention` child (its scheme's parameters, e.g. HNAS's u per head, are then
parameters of the model: they train, are in the state dict and in `save_pretrained`'s files),
and the model's implementation becomes "attnlab" (`set_attn_implementation`). The scheme's
options go into `model.config.attnlab`, so `config.json` says which scheme the weights were
trained with.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import nn

from attnlab.attention.spec import AttentionSpec
from attnlab.errors import ConfigError
from attnlab.hf.adapter import SchemeAttention
from attnlab.hf.interface import ADAPTER, IMPLEMENTATION, register

CONFIG_KEY = "attnlab"  # model.config.attnlab: the scheme, as AttentionSpec.to_dict()


@functools.cache
def _dispatches(cls: type) -> bool:
    try:
        return "ALL_ATTENTION_FUNCTIONS" in inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return False


def hf_attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """[(name, module)] of the modules of `model` whose forward calls transformers' attention
    interface, in named_modules() order."""
    return [(name, m) for name, m in model.named_modules()
            if not isinstance(m, SchemeAttention) and _dispatches(type(m))]


def _role(module: nn.Module) -> str:
    if getattr(module, "is_cross_attention", False) or "Cross" in type(module).__name__:
        return "cross"
    return "decoder" if getattr(module, "is_causal", False) else "encoder"


def _heads(module: nn.Module, config: Any) -> tuple[int, int]:
    """(number of query heads, head size) of a HF attention module."""
    heads = next((getattr(module, a) for a in ("num_attention_heads", "num_heads", "n_head")
                  if isinstance(getattr(module, a, None), int)), None)
    cfg = getattr(module, "config", config)
    heads = heads or getattr(cfg, "num_attention_heads", None)
    size = next((getattr(module, a) for a in ("attention_head_size", "head_dim")
                 if isinstance(getattr(module, a, None), int)), None)
    if heads is None:
        raise ConfigError(f"cannot tell how many heads {type(module).__name__} has (no "
                          f"num_attention_heads / num_heads attribute or config field)")
    return heads, size or cfg.hidden_size // heads


def _spec(scheme: str | AttentionSpec | Mapping, options: dict) -> AttentionSpec:
    if isinstance(scheme, AttentionSpec) and not options:
        return scheme
    if isinstance(scheme, Mapping):
        return AttentionSpec.from_config({**scheme, **options})
    return AttentionSpec.from_config({"scheme": str(scheme), **options})


def use_scheme(model: nn.Module, scheme: str | AttentionSpec | Mapping = "unas",
               **options: Any) -> nn.Module:
    """Make every attention of `model` (a transformers PreTrainedModel) run `scheme` with
    `options` (e.g. use_scheme(model, "hnas", hybrid_init=0.3, hybrid_per="layer")). Returns
    the model. Calling it again replaces the scheme (and its parameters)."""
    spec = _spec(scheme, options)
    if spec.cascades:
        raise ConfigError(f"model={spec.scheme} passes logits from layer to layer, which a "
                          f"transformers model's layers do not carry; use a scheme without a "
                          f"cascade (unas, dnas, hnas, sinkhorn, entmax, coda_cs)")
    modules = hf_attention_modules(model)
    if not modules or not hasattr(model, "set_attn_implementation"):
        raise ConfigError(f"{type(model).__name__} has no attention module that dispatches "
                          f"through transformers' AttentionInterface; attnlab.hf works on "
                          f"transformers 5 models that accept attn_implementation=")
    roles = [_role(m) for _, m in modules]
    if spec.normalizes_over_queries:
        bad = [(name, role) for (name, _), role in zip(modules, roles) if role != "encoder"]
        if bad:
            name, role = bad[0]
            why = ("causal: it would leak the future" if role == "decoder" else
                   "cross-attention: its queries' padding is unknown")
            raise ConfigError(f"model={spec.scheme} normalizes over queries and cannot run in "
                              f"{type(model).__name__}'s {name} ({why}); use a scheme that "
                              f"normalizes over keys there (unas, entmax)")
    if spec.causal_only:
        bad = [(name, role) for (name, _), role in zip(modules, roles) if role != "decoder"]
        if bad:
            from attnlab.attention.schemes import NORMALIZERS, fitting

            name, role = bad[0]
            fit = [n for n in fitting(causal=False) if n in NORMALIZERS]  # transforms cascade
            what = "cross-attention" if role == "cross" else "bidirectional self-attention"
            raise ConfigError(f"model={spec.scheme} is defined for causal attention only and cannot "
                              f"run in {type(model).__name__}'s {name} ({what}); use it in a "
                              f"decoder-only model, or here one of "
                              f"{', '.join(f'model={n}' for n in fit)}")
    for index, ((_, module), role) in enumerate(zip(modules, roles)):
        heads, size = _heads(module, getattr(model, "config", None))
        adapter = SchemeAttention(spec, heads, size, role, index)
        param = next(module.parameters(), None)
        if param is not None:
            adapter.to(device=param.device)
        module.add_module(ADAPTER, adapter)  # replaces a previous scheme's
    register()
    model.set_attn_implementation(IMPLEMENTATION)
    setattr(model.config, CONFIG_KEY, spec.to_dict())
    return model


def _saved_tensors(folder: Path) -> dict:
    """Every tensor of a save_pretrained folder (single file or sharded)."""
    from safetensors.torch import load_file

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return {k: v for shard in shards for k, v in load_file(str(folder / shard)).items()}
    single = folder / "model.safetensors"
    if not single.is_file():
        raise ConfigError(f"{folder} has no model.safetensors; save with model.save_pretrained")
    return load_file(str(single))


def from_pretrained(model_cls: type, path: str | Path, **kwargs: Any) -> nn.Module:
    """`model_cls.from_pretrained(path, **kwargs)`, then the scheme saved in its config.json
    (`config.attnlab`) with its trained parameters from the saved weights. A folder saved
    without a scheme loads as transformers loads it."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the scheme's tensors are "unexpected" to transformers
    try:
        model = model_cls.from_pretrained(path, **kwargs)
    finally:
        hf_logging.set_verbosity(verbosity)
    saved = getattr(model.config, CONFIG_KEY, None)
    if not saved:
        return model
    use_scheme(model, saved)
    own = [k for k in model.state_dict() if f".{ADAPTER}." in f".{k}"]
    if own:
        tensors = _saved_tensors(Path(path))
        prefix = getattr(model, "base_model_prefix", "") + "."
        found = {}
        for key in own:  # saved from this class, or from its base model / a head around it
            for name in (key, prefix + key, key.removeprefix(prefix)):
                if name in tensors:
                    found[key] = tensors[name]
                    break
        missing = sorted(set(own) - set(found))
        if missing:
            raise ConfigError(f"{path} was saved with model={saved['scheme']} but lacks its "
                              f"parameters {', '.join(missing[:3])}; save with save_pretrained "
                              f"after attnlab.hf.use_scheme")
        model.load_state_dict(found, strict=False)
    return model

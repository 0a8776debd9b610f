"""Validate the composed config before any work starts: one ConfigError, one line, per problem.

The schema is the code the config instantiates. Every node with a `_target_` under `trainer`,
`callbacks`, `logger` and `task` is checked against its class's signature: an unknown argument
(with a did-you-mean), and a value of the wrong type (from the annotations, with pydantic).
Ranges that types cannot say come from two tables: Trainer arguments that Lightning itself
accepts although they make no sense (`accumulate_grad_batches=0`), and the option names every
task uses alike (batch sizes, learning rates, dropout, fractions, lengths, widths, heads); an
option of one task only has its range where the task's class declares it, the class attribute
`option_rules` ({name: Rule}), so this module names no task and none of a task's own options. Other
Trainer arguments Lightning checks itself when the trainer is built, still before any data work.
The model group is the attention scheme's own business: `AttentionSpec.from_config`, called by
`runner.check_scheme_fits_task` right after `validate`.

Messages name the key the user types: `task.data.max_length`, not the interpolated
`task.datamodule.max_length` it feeds.
"""

from __future__ import annotations

import fnmatch
import inspect
import math
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf

from attnlab.compiling import MODES as COMPILE_MODES
from attnlab.errors import ConfigError, did_you_mean


@dataclass(frozen=True)
class Rule:
    ok: Callable[[Any], bool]
    allowed: str
    example: str


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _fractions(v) -> bool:
    return (isinstance(v, list) and len(v) == 3 and all(_number(x) and x >= 0 for x in v)
            and abs(sum(v) - 1) < 1e-6)


POSITIVE_INT = Rule(lambda v: _int(v) and v >= 1, "an integer >= 1", "32")
POSITIVE_INT_OR_NULL = Rule(lambda v: v is None or _int(v) and v >= 1, "an integer >= 1, or null", "100")
NONNEGATIVE = Rule(lambda v: _number(v) and v >= 0, "a number >= 0", "0.01")

# Lightning takes these values without complaint but they make no sense (checked with 2.6).
TRAINER_RULES: dict[str, Rule] = {
    "accumulate_grad_batches": Rule(POSITIVE_INT.ok, "an integer >= 1 (1: no accumulation)", "4"),
    "log_every_n_steps": Rule(POSITIVE_INT_OR_NULL.ok, "an integer >= 1", "50"),
    "check_val_every_n_epoch": Rule(POSITIVE_INT_OR_NULL.ok, "an integer >= 1, or null", "1"),
    "gradient_clip_val": Rule(lambda v: v is None or _number(v) and v >= 0,
                              "a number >= 0, or null (no clipping)", "1.0"),
    "num_sanity_val_steps": Rule(lambda v: v is None or _int(v) and v >= -1,
                                 "an integer >= 0, or -1 (all validation batches)", "2"),
    "min_epochs": Rule(lambda v: v is None or _int(v) and v >= 0, "an integer >= 0, or null", "1"),
    "min_steps": Rule(lambda v: v is None or _int(v) and v >= 0, "an integer >= 0, or null", "100"),
    "val_check_interval": Rule(lambda v: not _number(v) or v > 0,
                               "a fraction of the epoch in (0, 1] or a number of batches >= 1", "0.5"),
}

# Option names that mean the same in every task (tasks/*: datamodule and module arguments). An
# option of one task only is that task's business: its class's `option_rules` ({name: Rule}).
TASK_RULES: list[tuple[tuple[str, ...], Rule]] = [
    (("batch_size", "*_batch_size"), Rule(lambda v: v is None or _int(v) and v >= 1,
                                          "an integer >= 1", "32")),
    (("lr",), Rule(lambda v: _number(v) and v > 0, "a number > 0", "1e-3")),
    (("*_lr",), Rule(lambda v: v is None or _number(v) and v > 0,
                     "a number > 0, or null (the model's lr)", "0.05")),
    (("dropout", "*_dropout", "*dropout*"), Rule(lambda v: v is None or _number(v) and 0 <= v < 1,
                                                 "a number in [0, 1)", "0.1")),
    (("weight_decay", "warmup", "warmup_*", "eps"), NONNEGATIVE),
    (("*fractions",), Rule(_fractions, "three numbers >= 0 that sum to 1 (train, val, test)",
                           "[0.98,0.01,0.01]")),
    (("max_length", "max_*_length", "max_position*", "max_*_positions", "d_model", "nhead",
      "*_heads", "num_*layers", "dim_feedforward", "*_dim", "min_words", "max_words"),
     POSITIVE_INT),
    (("max_*_examples",), POSITIVE_INT_OR_NULL),
    (("num_workers",), Rule(lambda v: _int(v) and v >= 0, "an integer >= 0", "0")),
]
# Arguments whose config value attnlab reads and checks itself before the class sees it.
OWN_VALUES = {"pytorch_lightning.loggers.wandb.WandbLogger": {"log_model"}}  # best: wandb_runs
# Examples for type errors where the default makes a poor one.
EXAMPLES = {"precision": "bf16-mixed", "devices": "1", "accelerator": "cpu", "strategy": "ddp",
            "max_time": "00:12:00:00", "val_check_interval": "0.5"}
# (width, heads) pairs: each head gets width / heads dimensions.
HEAD_SPLITS = (("d_model", "nhead"),)
# what every seeder takes (numpy's legacy RandomState, Lightning's seed_everything): 32 bits
SEED_MAX = 2**32 - 1


def validate(cfg: DictConfig) -> None:
    """Raise ConfigError for the first problem of the composed train/eval config (the model
    group is checked by its attention scheme: runner.check_scheme_fits_task)."""
    _check_top_level(cfg)
    check_node(cfg, "trainer", TRAINER_RULES.get)
    for group in ("callbacks", "logger"):
        for name in (cfg.get(group) or {}):
            check_node(cfg, f"{group}.{name}")
    if cfg.get("task") is not None:
        for name in ("datamodule", "module"):
            check_node(cfg, f"task.{name}", task_rule)
        _check_head_splits(cfg, "task.module")
        _check_head_splits(cfg, "task.module.net")  # the injected network's width and heads


def check_accelerator(cfg: DictConfig) -> None:
    """A GPU accelerator (hardware=gpu, ddp, fsdp) on a machine without CUDA: one line naming
    the CPU choices, before Lightning's own "No supported gpu backend found!". Apart from
    `validate`, which judges the config alone (the shipped GPU configs are valid anywhere)."""
    import torch

    accelerator = OmegaConf.select(cfg, "trainer.accelerator", default=None)
    if str(accelerator) not in ("gpu", "cuda") or torch.cuda.is_available():
        return
    from hydra.core.hydra_config import HydraConfig

    choice = HydraConfig.get().runtime.choices.get("hardware") if HydraConfig.initialized() else None
    given = f"hardware={choice}" if choice else f"trainer.accelerator={accelerator}"
    raise ConfigError(f"{given} needs a CUDA GPU, and this machine has none; on the CPU use "
                      f"hardware=cpu, or hardware=ddp_cpu / hardware=fsdp_cpu for 2 processes")


def task_rule(name: str) -> Rule | None:
    for patterns, rule in TASK_RULES:
        if any(fnmatch.fnmatchcase(name, p) for p in patterns):
            return rule
    return None


def _check_top_level(cfg: DictConfig) -> None:
    checks = {
        "seed": (lambda v: _int(v) and 0 <= v <= SEED_MAX, f"an integer in [0, {SEED_MAX}]",
                 "seed=3"),
        "trust_checkpoint": (lambda v: isinstance(v, bool), "true or false", "trust_checkpoint=true"),
        "train": (lambda v: isinstance(v, bool), "true or false", "train=false"),
        "test": (lambda v: isinstance(v, bool), "true or false", "test=false"),
        "ckpt_path": (lambda v: v is None or isinstance(v, str), "last or a path to a .ckpt",
                      "ckpt_path=last"),
        "compile": (lambda v: isinstance(v, bool) or v in COMPILE_MODES,
                    f"true, false or a torch.compile mode ({', '.join(COMPILE_MODES)})",
                    "compile=true"),
        "split": (lambda v: v in ("test", "val"), "test or val", "split=val"),
        "task.monitor_mode": (lambda v: v in ("min", "max"), "min or max", "task.monitor_mode=max"),
        "task.optimized_metric": (lambda v: isinstance(v, str) and "/" in v,
                                  "a logged metric such as val/acc", "task.optimized_metric=val/acc"),
    }
    for key, (ok, allowed, example) in checks.items():
        if OmegaConf.select(cfg, key, default="__absent__", throw_on_missing=False) == "__absent__":
            continue
        if OmegaConf.is_missing(cfg, key):
            continue  # eval.py's ckpt_path=???: evaluate() says how to give it
        value = OmegaConf.select(cfg, key)
        if not ok(value):
            raise ConfigError(f"{key}={_show(value)}: expected {allowed}, e.g. {example}")


def check_node(cfg: DictConfig, key: str, rule_for: Callable[[str], Rule | None] = lambda _: None) -> None:
    """Arguments of the `_target_` node at `key`: names, types, ranges."""
    node = OmegaConf.select(cfg, key)
    if not isinstance(node, DictConfig) or "_target_" not in node:
        return
    target = str(node._target_)
    try:
        cls = get_object(target)  # a class, or a function (e.g. a scheduler factory)
    except Exception as err:  # noqa: BLE001 - ImportError, AttributeError, ...
        raise ConfigError(f"{key}._target_={target}: cannot import it ({str(err).splitlines()[0]})") from None
    params, takes_kwargs = _parameters(cls)
    raw = OmegaConf.to_container(node, resolve=False)
    values = OmegaConf.to_container(node, resolve=True)
    for name, value in values.items():
        if name.startswith("_"):
            continue  # _target_, _partial_, _recursive_, ...
        if _instantiated(value):  # an injected part (task.module.net, .optimizer): its own class's
            check_node(cfg, f"{key}.{name}", rule_for)
        where = _user_key(cfg, f"{key}.{name}", raw.get(name))
        # the class's own ranges first (a task's options: its classes' `option_rules`), then the
        # ones its group shares by name
        rule = getattr(cls, "option_rules", {}).get(name) or rule_for(name)
        if name not in params:
            if takes_kwargs:  # passed on (HeadlineModule's **options to Seq2SeqModule): ranges only
                _check_range(where, value, rule)
                continue
            raise ConfigError(
                f"{where}={_show(value)}: not an argument of {cls.__name__}{did_you_mean(name, params)}; "
                f"it takes {', '.join(params)}"
            )
        param = params[name]
        if name in OWN_VALUES.get(target, ()) or (
                param.default is not inspect.Parameter.empty and _same(value, param.default)):
            continue
        hint = _hints(cls).get(name)
        if hint is not None and not _instantiated(value) and not _type_ok(hint, value):
            example = rule.example if rule else EXAMPLES.get(name) or _example(hint, param.default)
            raise ConfigError(f"{where}={_show(value)}: expected {describe(hint)} "
                              f"({cls.__name__} argument {name}), e.g. {where}={example}")
        _check_range(where, value, rule)


def _check_range(where: str, value: Any, rule: Rule | None) -> None:
    if rule is not None and not rule.ok(value):
        raise ConfigError(f"{where}={_show(value)}: expected {rule.allowed}, e.g. {where}={rule.example}")


def _check_head_splits(cfg: DictConfig, key: str) -> None:
    node = OmegaConf.select(cfg, key)
    if not isinstance(node, DictConfig):
        return
    raw = OmegaConf.to_container(node, resolve=False)
    for width, heads in HEAD_SPLITS:
        w, h = node.get(width), node.get(heads)
        if _int(w) and _int(h) and h >= 1 and w % h:
            wk = _user_key(cfg, f"{key}.{width}", raw.get(width))
            hk = _user_key(cfg, f"{key}.{heads}", raw.get(heads))
            raise ConfigError(
                f"{wk}={w} is not divisible by {hk}={h}: each head gets {width} / {heads} dimensions; "
                f"e.g. {wk}={(w // h + 1) * h} or {hk}={_divisor(w, h)}"
            )


def _divisor(w: int, h: int) -> int:
    return max(d for d in range(1, h + 1) if w % d == 0)


# ----------------------------------------------------------------------------- helpers
_INTERPOLATION = re.compile(r"^\$\{([A-Za-z_][\w.]*)\}$")


def _user_key(cfg: DictConfig, key: str, raw: Any) -> str:
    """The key the user would type: follow plain interpolations (${task.data.max_length})."""
    for _ in range(5):
        match = _INTERPOLATION.match(raw) if isinstance(raw, str) else None
        if not match:
            return key
        key = match.group(1)
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(cfg, parent) if parent else cfg
        raw = OmegaConf.to_container(node, resolve=False).get(leaf) if isinstance(node, DictConfig) else None
    return key


def _show(value: Any) -> str:
    """A value as it would be typed on the command line."""
    if isinstance(value, str):
        return value if value else "''"
    return _plain(value)


def _plain(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_plain(v) for v in value) + "]"
    return str(value)


def _instantiated(value: Any) -> bool:
    """A nested `_target_` node (e.g. trainer.plugins): built by instantiate, not a plain value."""
    if isinstance(value, dict):
        return "_target_" in value
    return isinstance(value, list) and any(_instantiated(v) for v in value)


def _same(value: Any, default: Any) -> bool:
    """value is the parameter's default (then it needs no checking)."""
    default = list(default) if isinstance(default, tuple) else default
    try:
        return type(value) is type(default) and bool(value == default)
    except Exception:  # noqa: BLE001 - exotic defaults
        return False


@cache
def _parameters(cls: type) -> tuple[dict, bool]:
    signature = inspect.signature(_constructor(cls))
    params = {n: p for n, p in signature.parameters.items()
              if n != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    return params, takes_kwargs


def _constructor(target: Any) -> Any:
    return target.__init__ if isinstance(target, type) else target


@cache
def _hints(cls: type) -> dict[str, Any]:
    """Resolved annotations of cls.__init__, one by one (some refer to names only type checkers see)."""
    function = _constructor(cls)
    namespace = dict(getattr(function, "__globals__", {}))
    hints = {}
    for name, annotation in getattr(function, "__annotations__", {}).items():
        if name == "return":
            continue
        try:
            hints[name] = eval(annotation, namespace) if isinstance(annotation, str) else annotation
        except Exception:  # noqa: BLE001, S112 - unresolvable: that argument is not type-checked
            continue
    return hints


@cache
def _adapter(hint: Any):
    from pydantic import ConfigDict, TypeAdapter

    return TypeAdapter(hint, config=ConfigDict(arbitrary_types_allowed=True))


def _type_ok(hint: Any, value: Any) -> bool:
    if hint is Any:
        return True
    try:
        adapter = _adapter(hint)
    except Exception:  # noqa: BLE001 - a type pydantic cannot build a validator for
        return True
    try:
        adapter.validate_python(value)
    except Exception:  # noqa: BLE001 - pydantic.ValidationError and friends
        return False
    return True


def describe(hint: Any) -> str:
    """A type annotation in words: Optional[int] -> 'an integer or null'."""
    origin = typing.get_origin(hint)
    if origin is typing.Union or type(hint).__name__ == "UnionType":
        args = typing.get_args(hint)
        literals = [v for a in args if typing.get_origin(a) is typing.Literal for v in typing.get_args(a)]
        words = [f"one of {', '.join(dict.fromkeys(str(v) for v in literals))}"] if literals else []
        for arg in args:
            word = describe(arg) if typing.get_origin(arg) is not typing.Literal else None
            if word and word not in words:
                words.append(word)
        return " or ".join(words)
    if origin is typing.Literal:
        return "one of " + ", ".join(str(a) for a in typing.get_args(hint))
    base = origin or hint
    names = {bool: "true/false", int: "an integer", float: "a number", str: "a string",
             type(None): "null", list: "a list", tuple: "a list", dict: "a mapping"}
    if base in names:
        return names[base]
    if isinstance(base, type) and issubclass(base, Mapping):
        return "a mapping"
    if base in (typing.Sequence,) or getattr(base, "__name__", "") in ("Sequence", "Iterable"):
        return "a list"
    return getattr(base, "__name__", str(base))


def _example(hint: Any, default: Any) -> str:
    if default is not inspect.Parameter.empty and default is not None:
        return _plain(default)
    words = describe(hint)
    for word, example in (("an integer", "1"), ("a number", "0.5"), ("true/false", "true"),
                          ("a list", "[1,2]"), ("a string", "name")):
        if word in words:
            return example
    return "null"

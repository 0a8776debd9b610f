"""The contract every probe keeps, checked on whatever exists (nothing here lists probes or
generators): every module of tasks/probe/generators/ (discovered) at its own defaults, and every
conf/probe/*.yaml (globbed) composed with Hydra at a tiny size, in its main setting, each control
of its `compare` node, each point of its sweep and its --full / --gpu overrides. For each:

- shapes: inputs / targets / padding_mask consistent with `target_kind`, the optional per-row
  fields (n, L) where present, the baselines' predictions shaped like the targets;
- labels: every asked class in 0..num_classes-1, IGNORE elsewhere; at least one answer a row;
- the shortcut: `split_shortcut` (tasks/probe/datamodule.py) gives a number in [0, 1], None only
  where the probe has no shortcut at all; the trivial baseline a number in [0, 1];
- controls compose: the probe's overrides compose with `task=probe probe=<name>` and its generator
  takes the options they give;
- seeds: the same seed gives identical tensors, another seed other data.

`check_generator` and `check_probe` are what tests/tasks/probe/test_new_probe.py runs on the
worked example of docs/tasks.md ("A new probe").
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import pytest
import torch
from helpers.paths import CONF
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from attnlab.study.compare.probes import card_from_config
from tasks.probe.data import (
    IGNORE,
    PAD,
    REGRESSION,
    SEQUENCE_CLASS,
    TARGET_KINDS,
    TOKEN_CLASS,
    ProbeData,
)
from tasks.probe.datamodule import split_baseline, split_shortcut
from tasks.probe.generators import GENERATORS, generator

PROBES = sorted(p.stem for p in (CONF / "probe").glob("*.yaml"))
# a tiny draw: 16 training rows, 8 + 8 evaluated (the shortcut is scored on the last 16)
SIZES = {"n_train": 16, "n_val": 8, "n_test": 8}
TINY = tuple(f"probe.{k}={v}" for k, v in SIZES.items())
N = sum(SIZES.values())
TRAIN, EVALUATED = slice(0, SIZES["n_train"]), slice(SIZES["n_train"], N)
SEED = 3
ROW_FIELDS = ("aux_targets", "key_only", "query_only", "slots", "read_at")


def fields(data: ProbeData) -> dict[str, torch.Tensor]:
    """Every tensor a draw holds: its fields, the baselines' predictions and its meta's tensors."""
    out = {name: getattr(data, name) for name in ("inputs", "targets", "padding_mask",
                                                  "shortcut_features", *ROW_FIELDS)}
    out["baseline.predictions"] = data.baseline.predictions
    if data.shortcut is not None:
        out["shortcut.predictions"] = data.shortcut.predictions
    out |= {f"meta.{k}": v for k, v in data.meta.items() if isinstance(v, torch.Tensor)}
    return {k: v for k, v in out.items() if v is not None}


def labels_ok(values: torch.Tensor, num_classes: int) -> bool:
    """Class ids in 0..num_classes-1, or IGNORE."""
    asked = values[values != IGNORE]
    return values.dtype == torch.long and (asked.numel() == 0 or
                                           (int(asked.min()) >= 0 and int(asked.max()) < num_classes))


def check_data(data: ProbeData, n: int) -> None:
    """Shapes, dtypes and label ranges of one draw of `n` rows (the module docstring)."""
    assert isinstance(data, ProbeData), f"generate returned {type(data).__name__}, not ProbeData"
    assert data.target_kind in TARGET_KINDS, data.target_kind
    inputs, targets, padding = data.inputs, data.targets, data.padding_mask
    assert len(data) == n and inputs.shape[0] == n, (inputs.shape, n)
    length = inputs.shape[1]
    assert padding.dtype == torch.bool and padding.shape == (n, length), padding.shape
    if data.vocab_size:  # token ids, padding exactly where the token is PAD
        assert inputs.dtype == torch.long and inputs.dim() == 2, (inputs.dtype, inputs.shape)
        assert int(inputs.min()) >= 0 and int(inputs.max()) < data.vocab_size
        assert torch.equal(padding, inputs == PAD), "padding_mask is not exactly the PAD tokens"
    else:  # float points (n, L, d)
        assert inputs.is_floating_point() and inputs.dim() == 3, (inputs.dtype, inputs.shape)
        assert torch.isfinite(inputs).all()
    assert data.baseline.predictions.shape == targets.shape
    if data.target_kind == REGRESSION:
        assert data.num_classes == 0 and targets.is_floating_point() and targets.shape[0] == n
        return
    assert data.num_classes >= 2, data.num_classes
    expected = (n,) if data.target_kind == SEQUENCE_CLASS else (n, length)
    assert targets.shape == expected, f"{data.target_kind} targets {tuple(targets.shape)}, not {expected}"
    assert labels_ok(targets, data.num_classes), "a target outside 0..num_classes-1 and not IGNORE"
    asked = targets != IGNORE
    assert (asked if asked.dim() == 2 else asked[:, None]).any(dim=1).all(), "a row asks nothing"
    if data.target_kind == TOKEN_CLASS:
        assert not (asked & padding).any(), "an answer asked at padding"
    for baseline in (data.baseline, data.shortcut):
        if baseline is None:
            continue
        predictions = baseline.predictions
        assert predictions.shape == targets.shape, (baseline.name, predictions.shape)
        assert labels_ok(predictions, data.num_classes), baseline.name
        assert not (predictions[asked] == IGNORE).any(), f"{baseline.name}: no guess where asked"
        assert baseline.name and "\n" not in baseline.name
    if data.shortcut is not None:
        assert torch.equal(data.shortcut.predictions == IGNORE, ~asked), (
            "the shortcut's predictions are IGNORE exactly where nothing is asked")
    if data.shortcut_features is not None:
        features = data.shortcut_features
        assert features.dtype == torch.float32 and features.dim() == 2 and features.shape[0] == n
        assert torch.isfinite(features).all()
    for name in ROW_FIELDS:  # optional, (n, L) where present
        value = getattr(data, name)
        if value is not None:
            assert value.shape == (n, length), f"{name} {tuple(value.shape)}, not {(n, length)}"
            assert not value.is_floating_point(), f"{name} {value.dtype}"
    if data.aux_targets is not None:
        assert labels_ok(data.aux_targets, data.num_classes), "an aux target out of range"
        trained = data.aux_targets != IGNORE
        assert not (trained & padding).any(), "an aux target at padding"
        # never where the answer is asked (a sequence's: at position 0)
        assert not (trained & asked if data.target_kind == TOKEN_CLASS else trained[:, 0]).any()
    for name in ("key_only", "query_only"):
        role = getattr(data, name)
        if role is not None:
            assert role.dtype == torch.bool and not (role & padding).any(), name
    if data.key_only is not None and data.query_only is not None:
        assert not (data.key_only & data.query_only).any()
    if data.slots is not None:
        assert int(data.slots.min()) >= -1 and (data.slots[padding] == -1).all()
    if data.read_at is not None:
        assert int(data.read_at.min()) >= -1 and int(data.read_at.max()) < length


def check_scores(data: ProbeData) -> None:
    """The split's trivial baseline and shortcut, as the datamodule computes them."""
    if data.target_kind == REGRESSION:
        return  # not a probe run's target (the datamodule refuses it); no accuracy to score
    baseline = split_baseline(data, TRAIN, EVALUATED)
    assert 0.0 <= baseline <= 1.0, baseline
    shortcut = split_shortcut(data, TRAIN, EVALUATED)
    if data.shortcut is None and data.shortcut_features is None:
        assert shortcut is None
    else:
        assert shortcut is not None and math.isfinite(shortcut) and 0.0 <= shortcut <= 1.0, shortcut


def check_seeds(generate: Callable[..., ProbeData], options: dict) -> None:
    """The same seed draws identical tensors; another seed draws other data."""
    a, b, c = (generate(N, seed, **options) for seed in (SEED, SEED, SEED + 1))
    first, again = fields(a), fields(b)
    assert first.keys() == again.keys()
    for name in first:
        assert torch.equal(first[name], again[name]), f"{name} differs under the same seed"
    assert (a.shortcut is None) == (c.shortcut is None)
    assert not torch.equal(a.inputs, c.inputs), "another seed drew the same inputs"


def check_generator(name: str, generate: Callable[..., ProbeData], options: dict | None = None) -> None:
    """Every check on the generator `name` at `options` (its defaults when None)."""
    options = dict(options or {})
    data = generate(N, SEED, **options)
    assert isinstance(data, ProbeData), f"{name}: generate returned {type(data).__name__}"
    check_data(data, N)
    check_scores(data)
    check_seeds(generate, options)


def settings(cfg: DictConfig) -> list[tuple[str, tuple[str, ...]]]:
    """(name, overrides) of each setting of a composed probe config: its main setting, each
    condition compare trains besides it (the controls, the sweep's grid points) and the --full /
    --gpu overrides, read as compare reads them (attnlab.study.compare.probes)."""
    card = card_from_config(cfg)
    out = [(c.name, c.overrides) for c in card.conditions(controls=True, sweep=True)]
    out += [(f"--{mode}", overrides) for mode, overrides in card.mode_overrides.items() if overrides]
    return out


def check_probe(compose_probe: Callable[[list[str]], DictConfig], name: str) -> None:
    """Every check on conf/probe/<name>.yaml: each setting composed (`compose_probe(overrides)`:
    `task=probe probe=<name>` and the overrides) at the tiny size, its options drawn by its
    generator. Every broken setting is reported, not only the first."""
    cfg = compose_probe(list(TINY))
    assert cfg.probe.name == name, f"conf/probe/{name}.yaml says name: {cfg.probe.name}"
    generate = generator(str(cfg.probe.generator))
    broken = []
    for setting, overrides in settings(cfg):
        try:
            # the tiny sizes last: --gpu's probe.n_train=65536 must not draw 65536 rows here
            composed = compose_probe([*overrides, *TINY]) if overrides else cfg
            options = OmegaConf.to_container(composed.probe.options, resolve=True)
            assert composed.probe.generator == cfg.probe.generator
            data = generate(N, SEED, **options)
            check_data(data, N)
            assert data.target_kind != REGRESSION, "a probe run's target is a class"
            check_scores(data)
            if setting == "main":
                check_seeds(generate, options)
        except Exception as err:  # noqa: BLE001 - every setting's failure, reported together
            said = (str(err).splitlines() or [""])[0]
            broken.append(" ".join([setting, *overrides]) + f": {type(err).__name__}: {said}")
    assert not broken, f"conf/probe/{name}.yaml:\n  " + "\n  ".join(broken)


@pytest.fixture(scope="module")
def hydra_conf():
    with initialize_config_dir(str(CONF), version_base="1.3"):
        yield


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_every_generator_keeps_the_contract_at_its_defaults(name):
    check_generator(name, GENERATORS[name])


@pytest.mark.parametrize("probe", PROBES)
def test_every_probe_config_keeps_the_contract_in_every_setting(probe, hydra_conf):
    check_probe(lambda overrides: compose("train", overrides=["task=probe", f"probe={probe}",
                                                               "logger=none", *overrides]), probe)


def test_the_checks_catch_a_broken_draw():
    """The checks are not vacuous: a label out of range, a field of the wrong shape and data
    that ignore the seed each fail."""
    name = min(GENERATORS)
    good = GENERATORS[name](N, SEED)
    check_data(good, N)
    targets = good.targets.clone()
    targets[targets != IGNORE] = good.num_classes  # one past the last class
    with pytest.raises(AssertionError, match="outside 0..num_classes-1"):
        check_data(dataclasses.replace(good, targets=targets), N)
    with pytest.raises(AssertionError, match="slots"):
        check_data(dataclasses.replace(good, slots=torch.zeros(N, 1, dtype=torch.long)), N)
    with pytest.raises(AssertionError, match="another seed drew the same inputs"):
        check_seeds(lambda n, seed, **options: GENERATORS[name](n, 0, **options), {})

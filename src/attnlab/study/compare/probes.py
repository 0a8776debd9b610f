"""What compare knows of a probe: its config's `probe.compare` node, read by composing
`task=probe probe=<name>` with Hydra (so a probe built on another by `defaults:` inherits it).
Nothing here lists probes: they are `conf/probe/*.yaml`, each in the group's package (its keys
are `probe.<key>`):

    name: hub_key
    mechanism: "..."                 # one sentence: what decides the answer (required)
    lr: 3.0e-3                       # the probe's learning rate (compare also tries a grid)
    compare:                         # optional, and so is every key in it but a primary
                                     # probe's contrasts and controls
      family: primary                # primary: its contrasts enter the pre-registered family
                                     # exploratory (default): intervals, no verdict
      schemes: [unas, dnas, ...]     # what --quick trains on it (--full: every scheme)
      contrasts:                     # scheme against reference, and the predicted direction
        - {scheme: dnas, against: unas, predicts: worse}   # better | worse | equivalent
      min_effect: 0.05               # the accuracy difference the seeds must detect (80 %)
      margin: 0.03                   # the equivalence margin (TOST)
      positive:                      # an ablation that must break the probe
        removes: "..."               # what it takes away
        overrides: [...]
        expect: fall | vanish        # fall: `schemes` drop at least halfway to the shortcut;
        schemes: [...]               # vanish: the contrasts' differences at least halve
      negative:                      # a variant where theory says the schemes tie
        why: "..."
        overrides: [...]
      sweep: {key: [values], ...}    # difficulty sweep (--full), a grid of overrides; a
                                     # key set to null drops one a `defaults:` parent swept
      full: [...]                    # overrides of --full / --gpu (none: the probe's own sizes)
      gpu: [...]
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from attnlab.errors import ConfigError

FAMILIES = ("primary", "exploratory")
PREDICTIONS = ("better", "worse", "equivalent")
EXPECTATIONS = ("fall", "vanish")
MAIN, POSITIVE, NEGATIVE = "main", "positive control", "negative control"


@dataclass(frozen=True)
class ContrastSpec:
    scheme: str
    against: str
    predicts: str

    @property
    def name(self) -> str:
        return f"{self.scheme} vs {self.against}"


@dataclass(frozen=True)
class Control:
    overrides: tuple[str, ...]
    text: str  # what it removes (positive) / why the schemes must tie (negative)
    expect: str = ""  # positive: fall | vanish
    schemes: tuple[str, ...] = ()  # positive, expect=fall: whose accuracy must fall


@dataclass(frozen=True)
class Condition:
    """One setting of a probe: its name (main, a control, a sweep point) and its overrides."""

    name: str
    overrides: tuple[str, ...] = ()


@dataclass(frozen=True)
class ProbeCard:
    name: str
    mechanism: str
    family: str
    lr: float
    schemes: tuple[str, ...]
    contrasts: tuple[ContrastSpec, ...]
    min_effect: float
    margin: float
    positive: Control | None
    negative: Control | None
    sweep: dict[str, tuple] = field(default_factory=dict)
    mode_overrides: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # the main setting's value of each swept key (the composed config's)
    main: dict[str, object] = field(default_factory=dict)
    # probe.test_options: {option: [values]} the runs test on besides the training data
    # (compare --generalization; tasks/probe/datamodule.py)
    test_options: dict[str, tuple] = field(default_factory=dict)

    @property
    def primary(self) -> bool:
        return self.family == "primary"

    def conditions(self, controls: bool = True, sweep: bool = False,
                   main: dict[str, object] | None = None) -> list[Condition]:
        """main, then the controls, then the sweep's grid points (those not already main: the
        point whose every value is `main`'s, by default the card's own)."""
        main = self.main if main is None else main
        out = [Condition(MAIN)]
        if controls and self.positive:
            out.append(Condition(POSITIVE, self.positive.overrides))
        if controls and self.negative:
            out.append(Condition(NEGATIVE, self.negative.overrides))
        if sweep and self.sweep:
            keys = list(self.sweep)
            for values in itertools.product(*(self.sweep[k] for k in keys)):
                if all(k in main and same_value(v, main[k]) for k, v in zip(keys, values)):
                    continue
                overrides = tuple(f"{k}={v}" for k, v in zip(keys, values))
                out.append(Condition("sweep: " + ", ".join(f"{k.split('.')[-1]}={v}" for k, v in
                                                           zip(keys, values)), overrides))
        return out


def same_value(a, b) -> bool:
    """Two settings of an option, as a config or an override gives them (4 and 4.0, "0.5" and
    0.5, true and True are the same)."""
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return str(a).lower() == str(b).lower()


def _text(node, key: str, where: str) -> str:
    value = node.get(key) if node is not None else None
    if not value:
        raise ConfigError(f"{where}: `{key}` is missing; say it in one sentence")
    return str(value)


def _control(node, where: str, positive: bool) -> Control | None:
    if node is None:
        return None
    overrides = tuple(str(o) for o in node.get("overrides") or ())
    if not overrides:
        raise ConfigError(f"{where}.overrides: a control needs its overrides, e.g. "
                          f"[probe.options.<option>=<value>]")
    if not positive:
        return Control(overrides, _text(node, "why", where))
    expect = str(node.get("expect", ""))
    if expect not in EXPECTATIONS:
        raise ConfigError(f"{where}.expect={expect!r}: use one of {', '.join(EXPECTATIONS)}")
    schemes = tuple(node.get("schemes") or ())
    if expect == "fall" and not schemes:
        raise ConfigError(f"{where}.schemes: expect=fall names the schemes whose accuracy falls")
    return Control(overrides, _text(node, "removes", where), expect, schemes)


def card_from_config(cfg) -> ProbeCard:
    """The card of a composed `task=probe probe=<name>` config."""
    probe = cfg.probe
    where = f"conf/probe/{probe.name}.yaml: probe.compare"
    node = probe.get("compare") or OmegaConf.create({})
    family = str(node.get("family", "exploratory"))
    if family not in FAMILIES:
        raise ConfigError(f"{where}.family={family!r}: use primary or exploratory")
    contrasts = []
    for item in node.get("contrasts") or ():
        if not (OmegaConf.is_dict(item) and item.get("scheme") and item.get("against")):
            shown = OmegaConf.to_container(item) if OmegaConf.is_config(item) else item
            raise ConfigError(f"{where}.contrasts: {shown!r} names no "
                              f"`scheme` or no `against`; e.g. {{scheme: dnas, against: unas, "
                              f"predicts: better}}")
        spec = ContrastSpec(str(item.scheme), str(item.against), str(item.get("predicts", "")))
        if spec.predicts not in PREDICTIONS:
            raise ConfigError(f"{where}.contrasts: {spec.name} predicts {spec.predicts!r}; use "
                              f"one of {', '.join(PREDICTIONS)}")
        contrasts.append(spec)
    if family == "primary" and not contrasts:
        raise ConfigError(f"{where}: a primary probe names its contrasts")
    sweep = {str(k): tuple(v) for k, v in (node.get("sweep") or {}).items() if v is not None}
    modes = {mode: tuple(str(o) for o in node.get(mode) or ()) for mode in ("full", "gpu")}
    return ProbeCard(
        name=str(probe.name), mechanism=_text(probe, "mechanism", f"conf/probe/{probe.name}.yaml"),
        family=family, lr=float(probe.lr), schemes=tuple(node.get("schemes") or ()),
        contrasts=tuple(contrasts), min_effect=float(node.get("min_effect", 0.05)),
        margin=float(node.get("margin", 0.03)),
        positive=_control(node.get("positive"), f"{where}.positive", True),
        negative=_control(node.get("negative"), f"{where}.negative", False),
        sweep=sweep, mode_overrides=modes,
        main={k: OmegaConf.select(cfg, k, default=None) for k in sweep},
        test_options=_test_options(probe.get("test_options")))


def _test_options(node) -> dict[str, tuple]:
    """A probe's test_options as {option: (values...)}, a scalar a tuple of one, null dropped."""
    given = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
    return {str(k): tuple(v) if isinstance(v, list | tuple) else (v,)
            for k, v in (given or {}).items() if v is not None}


def probe_cards(conf_dir: Path, names: list[str] | None = None) -> dict[str, ProbeCard]:
    """{name: card} of conf/probe/*.yaml (or of `names`), in name order."""
    from hydra import compose, initialize_config_dir

    names = names or sorted(p.stem for p in (conf_dir / "probe").glob("*.yaml"))
    cards = {}
    with initialize_config_dir(str(conf_dir.resolve()), version_base="1.3"):
        for name in names:
            cfg = compose("train", overrides=["task=probe", f"probe={name}", "logger=none"])
            cards[name] = card_from_config(cfg)
    return cards

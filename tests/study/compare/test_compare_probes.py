"""What compare knows of a probe (attnlab.study.compare.probes): every conf/probe/*.yaml reads
into a card through Hydra (so a probe built on another inherits it), the primary family names
registered schemes, every condition of every mode draws data, a bad card is one ConfigError
naming its key, and a card's conditions come in a fixed order."""

import json
import shutil

import pytest
import yaml
from compare_fakes import card
from helpers.paths import CONF
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from attnlab.errors import ConfigError
from attnlab.study.compare.plan import ComparePlan, discover
from attnlab.study.compare.probes import (
    FAMILIES,
    MAIN,
    NEGATIVE,
    POSITIVE,
    card_from_config,
    probe_cards,
)
from tasks.probe.generators import GENERATORS

PROBES = discover(CONF, "probe")
MODELS = discover(CONF, "model")


@pytest.fixture(scope="module")
def configs():
    """Each probe's composed `task=probe probe=<name>` config."""
    with initialize_config_dir(str(CONF.resolve()), version_base="1.3"):
        return {name: compose("train", overrides=["task=probe", f"probe={name}", "logger=none"])
                for name in PROBES}


@pytest.fixture(scope="module")
def cards(configs):
    return {name: card_from_config(cfg) for name, cfg in configs.items()}


def test_every_probe_config_is_a_card(cards):
    assert PROBES == sorted(p.stem for p in (CONF / "probe").glob("*.yaml")) and len(PROBES) >= 4
    # probe_cards composes them itself (all of them, in name order: test_compare_cli)
    assert probe_cards(CONF, ["hub_key"]) == {"hub_key": cards["hub_key"]}
    for name, c in cards.items():
        assert c.name == name and c.family in FAMILIES and c.lr > 0 and c.mechanism
    assert sum(c.primary for c in cards.values()) >= 2  # the pre-registered family


def test_the_primary_family_names_registered_schemes_that_run(cards):
    """Each primary contrast's schemes are `model=` choices and among the probe's own schemes
    (--quick trains those: a contrast naming another would silently not run)."""
    for name, c in cards.items():
        if not c.primary:
            continue
        assert c.contrasts, name
        assert "unas" in c.schemes and set(c.schemes) <= set(MODELS), name
        for spec in c.contrasts:
            assert {spec.scheme, spec.against} <= set(c.schemes), (name, spec)
        assert c.positive and c.negative, f"{name}: a primary probe needs both controls"
        assert set(c.positive.schemes) <= set(c.schemes), name
        assert c.min_effect > 0 and c.margin > 0


def test_hub_key_zipf_inherits_hub_key_and_overrides_family_and_controls(configs, cards):
    hub, zipf = cards["hub_key"], cards["hub_key_zipf"]
    # inherited through Hydra's defaults list: the generator, the sizes, the rate, the network
    assert configs["hub_key_zipf"].probe.generator == configs["hub_key"].probe.generator == "hub"
    base, options = configs["hub_key"].probe.options, configs["hub_key_zipf"].probe.options
    assert options.num_pairs == base.num_pairs and options.num_queries == base.num_queries
    assert options.popularity == "zipf" and base.popularity == "hub"
    assert zipf.lr == hub.lr and zipf.contrasts == hub.contrasts
    assert configs["hub_key_zipf"].trainer.max_epochs == configs["hub_key"].trainer.max_epochs
    # overridden: the family and both controls
    assert hub.family == "primary" and zipf.family == "exploratory"
    assert hub.positive and hub.negative and zipf.positive is None and zipf.negative is None
    assert "probe.options.zipf_exponent" in zipf.sweep and zipf.mechanism != hub.mechanism


@pytest.mark.parametrize("probe", PROBES)
@pytest.mark.parametrize("mode", ["quick", "full", "gpu"])
def test_every_condition_of_every_mode_draws_data(configs, cards, mode, probe):
    """The mode's overrides, the controls' and the sweep points' name keys of the composed
    config, and the generator takes the options at those values: a mode that cannot start is
    found here, not after an hour of --full. (A probe named with --probes runs in any mode.)"""
    plan = ComparePlan(CONF.parent, mode, cards, MODELS)
    c, cfg = cards[probe], configs[probe]
    small = OmegaConf.merge(cfg, {"probe": {"n_train": 8}})  # options may refer to it
    broken = []
    for condition in plan.conditions(c):
        options = OmegaConf.to_container(small.probe.options, resolve=True)
        for override in (*c.mode_overrides.get(mode, ()), *condition.overrides):
            key, value = override.split("=", 1)
            assert OmegaConf.select(cfg, key, default=None) is not None, (probe, override)
            if key.startswith("probe.options."):
                options[key.removeprefix("probe.options.")] = yaml.safe_load(value)
        try:
            assert len(GENERATORS[cfg.probe.generator](8, 0, **options)) == 8
        except ValueError as err:
            broken.append(f"{condition.name}: {str(err)[:160]}")
    assert not broken, f"--{mode} {probe}: " + " | ".join(broken)


GOOD = {"name": "bad", "mechanism": "m", "lr": 0.003,
        "compare": {"family": "primary", "schemes": ["unas", "dnas"],
                    "contrasts": [{"scheme": "dnas", "against": "unas", "predicts": "better"}],
                    "positive": {"removes": "r", "overrides": ["probe.options.x=1"],
                                 "expect": "fall", "schemes": ["dnas"]},
                    "negative": {"why": "w", "overrides": ["probe.options.y=1"]}}}


def with_change(path: str, value):
    probe = json.loads(json.dumps(GOOD))
    *parents, last = path.split(".")
    node = probe
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if value is KeyError:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return OmegaConf.create({"probe": probe})


@pytest.mark.parametrize("path, value, says", [
    ("compare.family", "main", "probe.compare.family='main': use primary or exploratory"),
    ("compare.contrasts.0.predicts", "faster",
     ("probe.compare.contrasts: dnas vs unas predicts 'faster'; use one of better, worse, "
      "equivalent")),
    ("compare.contrasts.0.against", KeyError,
     ("probe.compare.contrasts: {'scheme': 'dnas', 'predicts': 'better'} names no `scheme` or "
      "no `against`")),
    ("compare.contrasts", [], "probe.compare: a primary probe names its contrasts"),
    ("compare.positive.expect", "drop",
     "probe.compare.positive.expect='drop': use one of fall, vanish"),
    ("compare.positive.schemes", [], "probe.compare.positive.schemes: expect=fall names"),
    ("compare.positive.overrides", [],
     "probe.compare.positive.overrides: a control needs its overrides"),
    ("compare.negative.overrides", KeyError, "probe.compare.negative.overrides: a control needs"),
    ("compare.negative.why", KeyError, "probe.compare.negative: `why` is missing"),
    ("compare.positive.removes", KeyError, "probe.compare.positive: `removes` is missing"),
    ("mechanism", KeyError, "conf/probe/bad.yaml: `mechanism` is missing"),
])
def test_a_bad_card_is_one_error_naming_its_key(path, value, says):
    assert card_from_config(OmegaConf.create({"probe": GOOD})).primary  # the good one reads
    with pytest.raises(ConfigError) as err:
        card_from_config(with_change(path, value))
    message = str(err.value)
    assert "\n" not in message and message.startswith("conf/probe/bad.yaml")
    assert says in message


def test_a_bad_probe_file_fails_when_its_cards_are_read(tmp_path):
    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    text = (conf / "probe" / "hub_key.yaml").read_text()
    assert "family: primary" in text
    (conf / "probe" / "hub_key.yaml").write_text(text.replace("family: primary", "family: main"))
    with pytest.raises(ConfigError, match=r"^conf/probe/hub_key.yaml: probe.compare.family='main'"):
        probe_cards(conf, ["hub_key"])
    assert list(probe_cards(conf, ["unmatched_key"])) == ["unmatched_key"]


def test_a_probe_without_the_optional_keys_is_a_card_every_mode_runs():
    """Every key of `probe.compare` but a primary probe's contrasts and controls is optional, the
    node itself too: an exploratory card with no --full or --gpu overrides (each mode trains it at
    its own sizes) and no conditions besides its main setting."""
    bare = card_from_config(OmegaConf.create({"probe": {"name": "bare", "mechanism": "m",
                                                        "lr": 0.01}}))
    assert bare.family == "exploratory" and bare.mode_overrides == {"full": (), "gpu": ()}
    for mode in ("quick", "full", "gpu"):
        plan = ComparePlan(CONF.parent, mode, {"bare": bare}, MODELS)
        assert [c.name for c in plan.conditions(bare)] == [MAIN]
        assert plan.mode_overrides(bare) == (["hardware=gpu"] if mode == "gpu" else [])


def test_an_exploratory_card_needs_no_contrasts_and_a_null_sweep_key_drops_out():
    probe = {"name": "e", "mechanism": "m", "lr": 0.01,
             "compare": {"sweep": {"probe.options.a": [1, 2], "probe.options.b": None}}}
    c = card_from_config(OmegaConf.create({"probe": probe, "x": 1}))
    assert c.family == "exploratory" and not c.primary and c.contrasts == ()
    assert c.positive is None and c.negative is None and c.schemes == ()
    assert c.sweep == {"probe.options.a": (1, 2)} and c.min_effect == 0.05 and c.margin == 0.03
    assert c.mode_overrides == {"full": (), "gpu": ()}


def test_conditions_come_main_controls_then_the_sweep_grid():
    c = card(sweep={"probe.options.n": (4, 8), "task.module.net.num_layers": (1, 2)},
             main={"probe.options.n": 4, "task.module.net.num_layers": 1})
    names = [x.name for x in c.conditions(sweep=True)]
    assert names == [MAIN, POSITIVE, NEGATIVE,  # the grid, first key slowest; (4, 1) is main
                     "sweep: n=4, num_layers=2", "sweep: n=8, num_layers=1",
                     "sweep: n=8, num_layers=2"]
    by_name = {x.name: x.overrides for x in c.conditions(sweep=True)}
    assert by_name[MAIN] == () and by_name[POSITIVE] == ("probe.options.a_queries=false",)
    assert by_name[NEGATIVE] == ("probe.options.disjoint=true",)
    assert by_name["sweep: n=8, num_layers=1"] == ("probe.options.n=8",
                                                   "task.module.net.num_layers=1")
    assert [x.name for x in c.conditions()] == [MAIN, POSITIVE, NEGATIVE]  # no sweep by default
    assert [x.name for x in c.conditions(controls=False)] == [MAIN]
    # another main setting (e.g. --gpu's sizes): every grid point is trained
    assert len(c.conditions(sweep=True, main={"probe.options.n": 32,
                                              "task.module.net.num_layers": 1})) == 3 + 4
    # values compare as numbers: 4.0 is main's 4
    assert len(c.conditions(sweep=True, main={"probe.options.n": "4.0",
                                              "task.module.net.num_layers": 1.0})) == 3 + 3
    bare = card(positive=None, negative=None)
    assert [x.name for x in bare.conditions(sweep=True)] == [MAIN]

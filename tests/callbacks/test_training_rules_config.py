"""Training rules come with their model config (conf/rules/ placed at callbacks.<name> through
Hydra defaults): one callback route, kept by callbacks=minimal|none, tuned as callbacks.<name>.*."""

import pytest
from helpers.paths import CONF
from hydra import compose, initialize_config_dir

from attnlab.callbacks import DisagreementRegularizer, RepulsiveAttention
from attnlab.runner import build_callbacks


def composed(*overrides):
    with initialize_config_dir(str(CONF), version_base=None):
        return compose("train", overrides=["logger=none", *overrides])


@pytest.mark.parametrize("group", ["default", "minimal", "none"])
def test_the_rule_comes_with_the_model_whatever_the_callbacks_group(group):
    repulsive = composed("model=repulsive", f"callbacks={group}")
    mar = composed("model=mar", f"callbacks={group}")
    assert repulsive.callbacks.repulsive._target_ == "attnlab.callbacks.RepulsiveAttention"
    assert mar.callbacks.disagreement._target_ == "attnlab.callbacks.DisagreementRegularizer"
    assert "callbacks" not in repulsive.model and "callbacks" not in mar.model  # no second route
    if group == "none":  # the runner builds it like any callback (the others need a run dir)
        [rule] = build_callbacks(repulsive)
        assert isinstance(rule, RepulsiveAttention) and rule.method == "svgd"
        [rule] = build_callbacks(mar)
        assert isinstance(rule, DisagreementRegularizer) and rule.weight == 0.1


def test_rule_options_are_set_under_callbacks():
    cfg = composed("model=repulsive", "callbacks=none", "callbacks.repulsive.method=spos", "seed=7")
    assert cfg.callbacks.repulsive.method == "spos" and cfg.callbacks.repulsive.seed == 7
    assert composed("model=repulsive_spos").callbacks.repulsive.method == "spos"
    back = composed("model=repulsive_spos", "callbacks.repulsive.method=svgd")
    assert back.callbacks.repulsive.method == "svgd"
    mar = composed("model=mar", "callbacks.disagreement.weight=0.5")
    assert mar.callbacks.disagreement.weight == 0.5
    assert build_callbacks(composed("model=unas", "callbacks=none")) == []

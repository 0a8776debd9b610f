"""Every probe's --full / --gpu overrides (conf/probe/<name>.yaml: probe.compare) name options its
generator takes, at values it can draw from: a mode that cannot start is found here, not after
an hour of --full."""

from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from attnlab.compare.plan import probe_mode_overrides
from tasks.probe import GENERATORS

CONF = Path(__file__).resolve().parents[2] / "conf"
PROBES = sorted(p.stem for p in (CONF / "probe").glob("*.yaml"))


@pytest.mark.parametrize("mode", ["full", "gpu"])
@pytest.mark.parametrize("probe", PROBES)
def test_mode_overrides_draw_data(probe, mode):
    raw = OmegaConf.load(CONF / "probe" / f"{probe}.yaml").probe
    overrides = probe_mode_overrides(CONF, probe, mode)
    assert overrides, f"{probe} has no probe.compare.{mode}"
    options = dict(OmegaConf.to_container(raw.options))
    default = dict(options)
    for o in overrides:
        key, value = o.split("=", 1)
        if key.startswith("probe.options."):
            options[key.removeprefix("probe.options.")] = yaml.safe_load(value)
    assert options != default or mode == "full"  # gpu always changes the sizes
    data = GENERATORS[raw.generator](8, 0, **options)
    assert len(data) == 8

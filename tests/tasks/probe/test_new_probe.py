"""The worked example of docs/tasks.md ("A new probe"), taken from the page itself so that the page
stays true: its generator file, put in a folder of the generators package's path (the discovery
every generator goes through, outside this checkout: other processes never see it), and its
YAML, in a config folder on Hydra's search path, are the whole probe. It is discovered (no list
edited), composes with `task=probe probe=<name>`, keeps the contract of test_probe_contract.py
(with and without the optional keys), reads as a compare card, is left out of every reproduce
claim, and trains. A generator module without `generate` is one error naming its file."""

from __future__ import annotations

import re
import shutil
import sys

import hydra
import pytest
import torch
import yaml
from helpers.cards import TINY
from helpers.paths import CONF, ROOT
from hydra import compose, initialize_config_dir
from test_probe_contract import check_generator, check_probe

import tasks.probe
from attnlab.errors import ConfigError
from attnlab.study.compare.probes import card_from_config
from attnlab.study.reproduce.plan import Plan
from attnlab.task_module import build_module
from tasks.probe import generators
from tasks.probe.generators import GENERATORS, discover

PAGE = ROOT / "docs" / "tasks.md"
# what a probe's YAML must say; everything else has a default in conf/task/probe.yaml
REQUIRED = {"name", "generator", "mechanism", "lr", "max_epochs"}


def example() -> tuple[str, str]:
    """(the generator's code, the YAML) that docs/tasks.md shows under "A new probe"."""
    text = PAGE.read_text()
    section = text[text.index("\n## A new probe\n"):]
    section = section[: section.find("\n## ", 1)] if "\n## " in section[1:] else section
    blocks = re.findall(r"^```(\w+)\n(.*?)^```", section, flags=re.DOTALL | re.MULTILINE)
    code = [b for lang, b in blocks if lang == "python" and b.startswith("# tasks/probe/generators/")]
    config = [b for lang, b in blocks if lang == "yaml" and b.startswith("# conf/probe/")]
    assert len(code) == 1 and len(config) == 1, "the section shows one generator and one YAML"
    return code[0], config[0]


@pytest.fixture
def new_probe(tmp_path):
    """The example's two files in place, and a copy of its YAML with only the required keys
    (`<name>_bare`); yields (name, generator module, the config folder). Afterwards the generator
    is gone again."""
    code, config = example()
    raw = yaml.safe_load(config)
    name, module = raw["name"], raw["generator"]
    assert module not in GENERATORS and not (CONF / "probe" / f"{name}.yaml").exists()
    folder = tmp_path / "generators"
    folder.mkdir()
    (folder / f"{module}.py").write_text(code)
    conf = tmp_path / "conf"
    (conf / "probe").mkdir(parents=True)
    (conf / "probe" / f"{name}.yaml").write_text(config)
    bare = {key: value for key, value in raw.items() if key in REQUIRED} | {"name": f"{name}_bare"}
    (conf / "probe" / f"{name}_bare.yaml").write_text(yaml.safe_dump(bare))
    generators.__path__.append(str(folder))
    try:
        discover()
        yield name, module, conf
    finally:
        generators.__path__.remove(str(folder))
        sys.modules.pop(f"{generators.__name__}.{module}", None)
        if hasattr(generators, module):
            delattr(generators, module)
        discover()
    assert module not in GENERATORS


def test_the_documented_probe_is_found_composes_keeps_the_contract_and_trains(new_probe, one_thread):
    name, module, conf = new_probe
    # discovered: the package's mapping (tasks.probe's is the same one), nothing edited
    assert GENERATORS[module].__module__ == f"tasks.probe.generators.{module}"
    assert tasks.probe.GENERATORS is GENERATORS
    search = f"hydra.searchpath=[file://{conf}]"
    with initialize_config_dir(str(CONF), version_base="1.3"):
        def composer(probe: str):
            return lambda overrides: compose("train", overrides=[
                search, "task=probe", f"probe={probe}", "logger=none", *overrides])

        cfg = composer(name)([])
        bare = composer(f"{name}_bare")([])
        check_generator(module, GENERATORS[module])
        check_probe(composer(name), name)
        check_probe(composer(f"{name}_bare"), f"{name}_bare")  # no optional key at all
        tiny = composer(name)(["model=dnas", *TINY["probe"]])
    raw = yaml.safe_load((conf / "probe" / f"{name}.yaml").read_text())
    assert cfg.probe.generator == module and cfg.task.datamodule.probe == module
    assert cfg.trainer.max_epochs == raw["max_epochs"] and cfg.task.module.optimizer.lr == raw["lr"]
    # the optional keys take conf/task/probe.yaml's defaults
    assert dict(bare.probe.options) == {} and list(bare.probe.claims) == []
    assert bare.task.module.net.num_layers == cfg.task.module.net.num_layers == 2
    # compare reads it: exploratory, no controls, each mode at its own sizes
    card = card_from_config(cfg)
    assert card.family == "exploratory" and card.positive is None and card.negative is None
    assert card.mode_overrides == {"full": (), "gpu": ()}
    # it trains: two steps of its loss lower the loss on a batch
    dm = hydra.utils.instantiate(tiny.task.datamodule, seed=0, data_seed=0)
    dm.setup()
    torch.manual_seed(0)
    model = build_module(tiny.task.module, dm.model_kwargs())
    batch = next(iter(dm.train_dataloader()))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for _ in range(2):
        with pytest.warns(match="self.log"):  # no trainer here: task_loss's logging is skipped
            loss = model.task_loss(batch, 0)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert losses[1] < losses[0]


def test_a_new_probe_enters_no_reproduce_claim_unless_it_says(new_probe, tmp_path):
    """`claims` is optional: a probe that leaves it out is trained by no claim of
    attnlab.reproduce (conf/task/probe.yaml's default), the shipped ones keep theirs."""
    name, _, conf = new_probe
    root = tmp_path / "checkout"
    shutil.copytree(CONF, root / "conf")
    shutil.copy(conf / "probe" / f"{name}.yaml", root / "conf" / "probe")
    plan = Plan("quick", root)
    assert ("probe=" + name,) in plan.variants("probe")
    for claim in plan.cards["probe"].claims:
        entered = plan.variants("probe", claim)
        assert ("probe=" + name,) not in entered and entered, claim


def test_a_generator_module_without_generate_is_one_error_naming_it(tmp_path):
    folder = tmp_path / "generators"
    folder.mkdir()
    (folder / "half_written.py").write_text('"""A generator not written yet."""\n')
    (folder / "_helper.py").write_text("X = 1\n")  # a helper: no generate needed
    generators.__path__.append(str(folder))
    try:
        with pytest.raises(ConfigError) as error:
            discover()
        message = str(error.value)
        assert message.startswith(f"{folder / 'half_written.py'} defines no `generate(n, seed, ")
        assert "\n" not in message and "_half_written.py" in message
    finally:
        generators.__path__.remove(str(folder))
        for module in ("half_written", "_helper"):
            sys.modules.pop(f"{generators.__name__}.{module}", None)
        discover()
    assert "half_written" not in GENERATORS and "_helper" not in GENERATORS

"""The probe task: splits, the baseline each split logs, the module's accuracy against a count by
hand, and every conf/probe/*.yaml through the real CLI with the keys the comparison reads.
(The optional fields, roles, auxiliary targets, the learning-curve area, head collisions and
the shortcut: test_probe_roles.py.)"""

from collections import Counter

import hydra
import pytest
import pytorch_lightning as pl
import torch
from helpers.cards import CARDS, TINY
from helpers.cli import QUIET, cli_env, metrics_files, run_app
from helpers.paths import CONF
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from attnlab.errors import ConfigError
from attnlab.task_module import build_module
from tasks.probe.data import IGNORE
from tasks.probe.datamodule import ProbeDataModule
from tasks.probe.generators import GENERATORS
from tasks.probe.module import ProbeModule
from tasks.probe.network import ProbeEncoder

PROBES = sorted(p.stem for p in (CONF / "probe").glob("*.yaml"))


def datamodule(probe: str, options: dict, **sizes) -> ProbeDataModule:
    dm = ProbeDataModule(probe, options, **{"n_train": 200, "n_val": 60, "n_test": 40,
                                            "data_seed": 0, "batch_size": 64, "seed": None,
                                            "test_options": None, **sizes})
    dm.setup()
    return dm


def test_the_splits_are_cut_from_one_draw_without_overlap():
    dm = datamodule("listops", {"seq_len": 24, "min_length": 4, "max_depth": 3, "max_args": 4})
    rows = {s: [tuple(r) for r in dm.splits[s].inputs.tolist()] for s in ("train", "val", "test")}
    assert [len(rows[s]) for s in rows] == [200, 60, 40]
    assert len(set(rows["train"]) | set(rows["val"]) | set(rows["test"])) == 300  # ListOps: distinct
    assert torch.equal(dm.splits["val"].inputs, dm.data.inputs[200:260])
    again = datamodule("listops", {"seq_len": 24, "min_length": 4, "max_depth": 3, "max_args": 4})
    assert torch.equal(again.splits["test"].fields["targets"], dm.splits["test"].fields["targets"])


def test_a_batch_carries_the_optional_fields_of_its_rows():
    """Every optional per-row field the probe has (and only those) travels with the batch,
    cut from the same rows as the inputs."""
    dm = datamodule("hub", {"num_pairs": 6, "num_queries": 4, "hub_queries": 2, "key_vocab": 8,
                            "value_vocab": 8, "popularity": "zipf", "ask_every_key": True})
    batch = dm.splits["test"].__getitems__([3, 0])
    assert set(batch) == {"inputs", "targets", "padding_mask", "aux_targets", "key_only",
                          "query_only", "read_at"}
    for name, value in batch.items():
        assert torch.equal(value, getattr(dm.data, name)[[263, 260]]), name
    slotted = datamodule("retrieval", {"seq_len": 12, "num_slots": 2, "num_values": 3})
    assert set(slotted.splits["val"].__getitems__([0])) == {"inputs", "targets", "padding_mask",
                                                             "slots"}


def test_majority_baseline_is_the_training_majority_scored_on_the_split():
    dm = datamodule("listops", {"seq_len": 24, "min_length": 4, "max_depth": 3, "max_args": 4})
    train = dm.splits["train"].fields["targets"].tolist()
    majority = Counter(train).most_common(1)[0][0]
    # the training rows' majority, scored on each split (a split's own majority scores
    # differently here: predicting it fails this test)
    for split in ("val", "test"):
        asked = dm.splits[split].fields["targets"].tolist()
        assert dm.baselines[split] == pytest.approx(sum(t == majority for t in asked) / len(asked))
    assert dm.model_kwargs()["baseline_name"] == "majority"


@pytest.mark.parametrize("probe, options, chance", [
    ("recall", {"seq_len": 24, "vocab_size": 32, "num_kv_pairs": 3, "num_distractors": 2}, 1 / 5),
    ("retrieval", {"seq_len": 12, "num_slots": 2, "num_values": 3}, 1 / 9),
    ("clusters", {"num_points": 16, "min_clusters": 2, "max_clusters": 4}, 1 / 3),
    ("unmatched", {"num_objects": 3, "object_vocab": 8, "num_colours": 5}, 1 / 5),
    # context values repeat: 1 / pairs + (1 - 1 / pairs) / values
    ("hub", {"num_pairs": 6, "num_queries": 4, "hub_queries": 2, "key_vocab": 8,
             "value_vocab": 10}, 1 / 6 + (5 / 6) / 10),
    ("assignment", {"num_items": 4, "positions": 16, "num_colours": 6, "collisions": 0.25}, 1 / 6),
])
def test_chance_baseline_is_its_expectation(probe, options, chance):
    dm = datamodule(probe, options)
    assert dm.baselines == {"val": pytest.approx(chance), "test": pytest.approx(chance)}
    assert dm.model_kwargs()["baseline_name"] == "chance"


@pytest.mark.parametrize("options, words", [
    ({"num_objects": 8, "object_vocab": 8}, "pass object_vocab >= 9"),  # the generator's check
    ({"length": 8}, "unexpected keyword argument"),  # an option of no probe
])
def test_bad_probe_options_are_one_config_error(options, words):
    with pytest.raises(ConfigError, match=words) as error:
        datamodule("unmatched", options)
    assert "probe.options of unmatched" in str(error.value) and "\n" not in str(error.value)


def build(dm: ProbeDataModule, scheme: str = "unas", **net) -> ProbeModule:
    kw = dm.model_kwargs()
    net = ProbeEncoder(kw["num_classes"], kw["seq_len"], kw["vocab_size"], kw["input_dim"],
                       attention=scheme, **{"d_model": 16, "nhead": 2, "num_layers": 2, "positions": "learned",
                                            "dim_feedforward": 32, **net})
    return ProbeModule(net, torch.optim.AdamW, target_kind=kw["target_kind"],
                       baselines=kw["baselines"], baseline_name=kw["baseline_name"],
                       shortcuts=kw["shortcuts"])


@pytest.mark.parametrize("probe, options", [
    ("recall", {"seq_len": 24, "vocab_size": 32, "num_kv_pairs": 4}),  # an answer per query
    ("clusters", {"num_points": 16}),  # float points, the answer at a CLS in front
    # roles (a key-only context, query-only queries) and zipf padding
    ("hub", {"num_pairs": 6, "num_queries": 4, "key_vocab": 8, "value_vocab": 8,
             "popularity": "zipf", "ask_every_key": True}),
])
def test_validation_accuracy_and_baseline_match_a_count_by_hand(probe, options, one_thread):
    torch.manual_seed(0)
    dm = datamodule(probe, options, n_val=70)
    module = build(dm)
    trainer = pl.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False)
    trainer.validate(module, dm.val_dataloader(), verbose=False)
    split = dm.splits["val"].fields
    with torch.no_grad():
        logits = module.net(split["inputs"], split["padding_mask"], split.get("key_only"),
                            split.get("query_only"))
    right, asked, whole = 0, 0, 0
    for row, targets in zip(logits.argmax(-1).tolist(), split["targets"].tolist()):
        pairs = [(row[0], targets)] if isinstance(targets, int) else [
            (p, t) for p, t in zip(row, targets) if t != IGNORE]
        right += sum(p == t for p, t in pairs)
        asked += len(pairs)
        whole += all(p == t for p, t in pairs)
    metrics = trainer.callback_metrics
    assert float(metrics["val/acc"]) == pytest.approx(right / asked, abs=1e-6)
    assert float(metrics["val/seq_acc"]) == pytest.approx(whole / 70, abs=1e-6)
    assert float(metrics["val/answers"]) == asked
    assert float(metrics["val/baseline_acc"]) == pytest.approx(dm.baselines["val"])
    assert float(metrics["val/shortcut_acc"]) == pytest.approx(dm.shortcuts["val"])
    # what calibration reads: the asked answers' logits and labels
    batch = dm.splits["val"].__getitems__(list(range(5)))
    out, labels = module(batch)
    n = 5 if probe == "clusters" else int((batch["targets"] != IGNORE).sum())
    assert out.shape == (n, dm.data.num_classes) and labels.shape == (n,)


def probe_file_value(probe: str, key: str):
    """`key` as conf/probe/<probe>.yaml writes it (the group's own package: `lr`, `net.nhead`),
    or as the probe it builds on does; None where neither does."""
    raw = OmegaConf.load(CONF / "probe" / f"{probe}.yaml")
    value = OmegaConf.select(raw, key)
    if value is None:
        parents = [d for d in raw.get("defaults", []) if d != "_self_"]
        return probe_file_value(parents[0], key) if parents else None
    return value


@pytest.mark.parametrize("probe", PROBES)
def test_a_probes_learning_rate_epochs_and_network_have_one_home(probe):
    """The run's learning rate and epochs are those its conf/probe/<probe>.yaml shows: the task's
    file gives them no value (`???`) that every probe would override unseen; its network sizes
    are the probe's `net`, else the task's `probe.net` defaults; and a probe file sets nothing
    outside the probe's own keys (no `# @package _global_`)."""
    task = OmegaConf.load(CONF / "task" / "probe.yaml")
    assert OmegaConf.is_missing(task.probe, "lr") and OmegaConf.is_missing(task.probe, "max_epochs")
    assert OmegaConf.to_container(task.trainer)["max_epochs"] == "${probe.max_epochs}"
    assert "@package" not in (CONF / "probe" / f"{probe}.yaml").read_text()
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=["task=probe", f"probe={probe}", "logger=none"])
        # what users and compare's controls type still wins over the probe's value
        typed = compose("train", overrides=["task=probe", f"probe={probe}", "logger=none",
                                            "trainer.max_epochs=1", "task.module.net.nhead=1"])
    assert cfg.task.module.optimizer.lr == probe_file_value(probe, "lr")
    assert cfg.trainer.max_epochs == probe_file_value(probe, "max_epochs")
    for key in ("d_model", "nhead", "num_layers", "dim_feedforward"):
        own = probe_file_value(probe, f"net.{key}")
        assert cfg.task.module.net[key] == (task.probe.net[key] if own is None else own), key
    assert typed.trainer.max_epochs == 1 and typed.task.module.net.nhead == 1


@pytest.mark.parametrize("probe", PROBES)
def test_every_probe_config_builds_a_model_that_trains(probe, one_thread):
    """conf/probe/<probe>.yaml composed as train.py composes it (tiny sizes): its data, a model
    of the data's sizes, and two training steps of its loss (auxiliary answers included) that
    lower the loss on its batch."""
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=["task=probe", f"probe={probe}", "model=hnas",
                                          "logger=none", *TINY["probe"]])
    assert cfg.probe.name == probe and cfg.task.datamodule.probe in GENERATORS
    dm = hydra.utils.instantiate(cfg.task.datamodule, seed=0, data_seed=0)
    dm.setup()
    assert len(dm.splits["train"]) == cfg.probe.n_train
    torch.manual_seed(0)
    module = build_module(cfg.task.module, dm.model_kwargs())
    batch = next(iter(dm.train_dataloader()))
    optimizer = torch.optim.SGD(module.parameters(), lr=0.05)
    losses = []
    for _ in range(2):
        with pytest.warns(match="self.log"):  # no trainer here: task_loss's logging is skipped
            loss = module.task_loss(batch, 0)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert losses[1] < losses[0]


def carries_slots(run_dir) -> bool:
    """Whether a run's probe data carry slots (test/collision_rate is logged for those only)."""
    probe = OmegaConf.load(run_dir / "config.yaml").probe
    rows = probe.n_train + probe.n_val + probe.n_test
    options = OmegaConf.to_container(probe.options, resolve=True)
    return GENERATORS[probe.generator](rows, 0, **options).slots is not None


@pytest.mark.slow  # ~30 s: eight tiny runs with every analysis
def test_every_probe_config_runs_and_writes_the_keys_the_comparison_reads(tmp_path, data_dir):
    """Every conf/probe/*.yaml, tiny, in one multirun (HNAS: u is reported), every analysis."""
    result = run_app(["-m", "task=probe", f"probe={','.join(PROBES)}", "model=hnas",
                      *TINY["probe"], *QUIET], cli_env(tmp_path, data_dir))
    assert result.code == 0, result.stderr[-3000:]
    records = metrics_files(tmp_path / "outputs" / "multirun")
    probes = [next(o for o in r["overrides"] if o.startswith("probe=")) for r in records]
    assert sorted(p.split("=")[1] for p in probes) == PROBES
    assert all(f"_probe-{p.split('=')[1]}_hnas_" in r["_dir"].name for p, r in zip(probes, records))
    card = CARDS["probe"]
    for probe, r in zip(probes, records):
        probe = probe.split("=")[1]
        assert r["status"] == "ok", r.get("error")
        m = r["metrics"]
        # every probe has a shortcut (a rule, or clusters' fitted moments): card.metrics has it
        keys = {card.optimized_metric, card.baseline, *card.metrics, "val/avg_jsd",
                "val/head_distance", "val/ece", "test/answers", "test/shortcut_acc",
                "val/acc_auc", "val/shortcut_acc"}
        layers = OmegaConf.load(r["_dir"] / "config.yaml").task.module.net.num_layers
        for layer in range(layers):
            keys |= {f"explained_away/layer{layer}/{k}" for k in
                     ("share_below_1e-08", "min_col_sum_times_S", "entropy")}
        assert keys <= set(m), keys - set(m)
        assert ("test/collision_rate" in m) == carries_slots(r["_dir"]), probe
        assert 0 <= m["val/baseline_acc"] < 1 and r["scheme_params"]["hnas_u"]
        assert m["test/answers"] >= 32  # at least one answer per test sequence (32 of them)
        # one validation (max_epochs=1): the area under the curve is its accuracy
        assert m["val/acc_auc"] == pytest.approx(m["val/acc"])


@pytest.mark.parametrize("shift, reach", [(True, [4, 5, 6]), (False, [5])])
def test_token_shift_mixes_each_token_with_its_two_neighbours_only(shift, reach):
    """Without attention layers, a token reaches the logits of its own and (with the shift) its
    neighbours' positions, and nothing else."""
    torch.manual_seed(0)
    net = ProbeEncoder(5, 12, vocab_size=10, attention="unas", num_layers=0, d_model=8, nhead=2,
                       dim_feedforward=128, token_shift=shift, positions="learned").eval()
    tokens = torch.randint(1, 10, (1, 12))
    other = tokens.clone()
    other[0, 5] = 1 + tokens[0, 5] % 9
    free = torch.zeros(1, 12, dtype=torch.bool)
    with torch.no_grad():
        changed = (net(tokens, free) - net(other, free)).abs().amax(-1)[0] > 1e-6
    assert changed.nonzero().flatten().tolist() == reach

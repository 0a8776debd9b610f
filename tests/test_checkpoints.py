"""attnlab.checkpoints and runner.resolve_ckpt_path, in-process: what resume and eval trust.

The end-to-end runs (tests/e2e/test_faults.py, test_old_checkpoints.py) go through train.py and
eval.py in subprocesses; these tests call the functions themselves, so that `make mutate` sees them.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import fsspec
import numpy as np
import pytest
import torch
from helpers.cards import CARDS, TINY
from helpers.paths import CONF, FIXTURES
from omegaconf import DictConfig, OmegaConf

from attnlab import checkpoints, trust
from attnlab.errors import ConfigError, DataError
from attnlab.runner import resolve_ckpt_path

EXAMPLE = "outputs/<task>/<model>/<run>/checkpoints/last.ckpt"


def save(path: Path, obj, **kwargs) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(obj, path, **kwargs)
    return path


def lightning(w: float = 1.0) -> dict:
    """A checkpoint as attnlab writes one: weights, and hyper-parameters as plain data."""
    return {"state_dict": {"w": torch.full((3,), w)}, "epoch": 2,
            "hyper_parameters": {"attention": {"name": "hnas"}}}


def pickled(w: float = 1.0) -> dict:
    """A checkpoint as Lightning wrote one before: hyper-parameters holding a DictConfig and the
    optimizer's partial, which torch.load(weights_only=True) refuses to unpickle."""
    return {**lightning(w), "hyper_parameters": {
        "attention": OmegaConf.create({"name": "hnas"}),
        "optimizer": functools.partial(torch.optim.AdamW, lr=1e-3, weight_decay=0.01)}}


class Payload:
    """What a crafted checkpoint holds: unpickling it runs a command (here: touches a file)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def mapped(path: Path) -> bool:
    """Is the file memory-mapped into this process now?"""
    return any(str(path.resolve()) in line for line in Path("/proc/self/maps").read_text().splitlines())


# ----------------------------------------------------------------------------- AtomicCheckpointIO
def test_a_save_writes_a_loadable_file_through_its_partial_name(tmp_path, monkeypatch):
    path = tmp_path / "deep" / "last.ckpt"  # its folder is created
    opened = []
    real_open = open

    def spy(file, *args, **kwargs):
        opened.append(Path(file).name)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", spy)
    checkpoints.AtomicCheckpointIO().save_checkpoint(lightning(4.0), path)
    monkeypatch.undo()
    assert opened == [".last.ckpt.partial"]  # written aside, then renamed over the old one
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.ckpt"]
    assert torch.equal(torch.load(path, weights_only=False)["state_dict"]["w"], torch.full((3,), 4.0))


def test_a_failing_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    io = checkpoints.AtomicCheckpointIO()
    io.save_checkpoint(lightning(1.0), path)

    def fail(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a zip")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", fail)
    with pytest.raises(OSError, match="disk full"):
        io.save_checkpoint(lightning(2.0), path)
    monkeypatch.undo()
    assert torch.equal(checkpoints.read(path)["state_dict"]["w"], torch.ones(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_a_remote_path_goes_through_lightnings_own_save(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a local write of "memory://..." would land here
    checkpoints.AtomicCheckpointIO().save_checkpoint(lightning(3.0), "memory://attnlab-test/run/last.ckpt")
    with fsspec.open("memory://attnlab-test/run/last.ckpt", "rb") as f:
        ckpt = torch.load(f, weights_only=False)
    fsspec.filesystem("memory").rm("memory://attnlab-test", recursive=True)
    assert torch.equal(ckpt["state_dict"]["w"], torch.full((3,), 3.0))
    assert list(tmp_path.iterdir()) == []
    # storage_options reach the parent, which refuses them (as Lightning's default does)
    with pytest.raises(TypeError, match="storage_options"):
        checkpoints.AtomicCheckpointIO().save_checkpoint(lightning(), "memory://x/last.ckpt", {"a": 1})


# ----------------------------------------------------------------------------- read
def test_read_memory_maps_a_checkpoint_and_keeps_its_objects(tmp_path):
    path = save(tmp_path / "last.ckpt", lightning(5.0))
    ckpt = checkpoints.read(path)
    assert mapped(path)  # the cheap load: tensors stay in the file until used
    assert torch.equal(ckpt["state_dict"]["w"], torch.full((3,), 5.0)) and ckpt["epoch"] == 2
    assert ckpt["hyper_parameters"]["attention"] == {"name": "hnas"}
    assert ckpt["state_dict"]["w"].device.type == "cpu"


def test_read_loads_a_legacy_non_zip_checkpoint(tmp_path):
    path = save(tmp_path / "old.ckpt", lightning(6.0), _use_new_zipfile_serialization=False)
    ckpt = checkpoints.read(path)
    assert torch.equal(ckpt["state_dict"]["w"], torch.full((3,), 6.0))
    assert ckpt["hyper_parameters"]["attention"]["name"] == "hnas"


@pytest.mark.parametrize("zipped", [True, False], ids=["zip", "legacy"])
def test_read_loads_a_gpu_runs_checkpoint_onto_the_cpu(zipped, tmp_path, monkeypatch):
    # the storages tagged as torch.save tags them on a GPU: a GPU run evaluated on a laptop
    monkeypatch.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
    path = save(tmp_path / "gpu.ckpt", lightning(7.0), _use_new_zipfile_serialization=zipped)
    monkeypatch.undo()
    ckpt = checkpoints.read(path)
    assert ckpt["state_dict"]["w"].device.type == "cpu"
    assert torch.equal(ckpt["state_dict"]["w"], torch.full((3,), 7.0))
    assert mapped(path) == zipped  # a zip file still memory-mapped


def test_read_a_missing_file_or_a_directory_names_the_key_and_an_example(tmp_path):
    with pytest.raises(DataError) as err:
        checkpoints.read(tmp_path / "nope.ckpt")
    assert str(err.value) == (f"ckpt_path={tmp_path / 'nope.ckpt'} does not exist; give an existing "
                              f"file, e.g. ckpt_path={EXAMPLE}")
    with pytest.raises(DataError) as err:
        checkpoints.read(tmp_path, key="init_ckpt")
    assert str(err.value) == (f"init_ckpt={tmp_path} is a directory, not a file; give a file, "
                              f"e.g. init_ckpt={EXAMPLE}")


def test_read_a_truncated_file_says_so_with_torchs_reason_and_the_other_checkpoints(tmp_path):
    whole = save(tmp_path / "epoch_1.ckpt", lightning()).read_bytes()
    (tmp_path / "last.ckpt").write_bytes(whole[: len(whole) // 2])
    save(tmp_path / "best.ckpt", lightning())
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    with pytest.raises(DataError) as err:
        checkpoints.read(tmp_path / "last.ckpt", key="resume")
    message = str(err.value)
    assert "\n" not in message and err.value.__cause__ is None
    assert message.startswith(f"resume={tmp_path / 'last.ckpt'} is not a readable checkpoint (truncated "
                              "or corrupt: PytorchStreamReader failed reading zip archive: failed "
                              "finding central directory")
    assert message.endswith(f"); use another one, e.g. one of best.ckpt, epoch_1.ckpt in {tmp_path}")


def test_read_an_unreadable_file_alone_in_its_folder_gives_the_error_type(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    path.write_bytes(b"")
    with pytest.raises(DataError) as err:
        checkpoints.read(path)
    assert str(err.value) == (f"ckpt_path={path} is not a readable checkpoint (truncated or corrupt: "
                              "the file is empty); use another one")
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(DataError, match=r"\(truncated or corrupt: neither a zip archive nor a pickle\)"):
        checkpoints.read(path)
    path.write_bytes(b"PK" + b"\0" * 40)

    def silent(*args, **kwargs):
        raise EOFError()

    monkeypatch.setattr(torch, "load", silent)  # an error without a message: its type instead
    with pytest.raises(DataError, match=r"\(truncated or corrupt: EOFError\); use another one$"):
        checkpoints.read(path)


@pytest.mark.parametrize("content", [[1, 2], {"epoch": 3}], ids=["not-a-dict", "no-state-dict"])
def test_read_a_pickle_that_is_not_a_lightning_checkpoint(content, tmp_path):
    path = save(tmp_path / "x.ckpt", content)
    save(tmp_path / "last.ckpt", lightning())
    with pytest.raises(DataError) as err:
        checkpoints.read(path, key="ckpt")
    assert str(err.value) == (f"ckpt={path} is not a Lightning checkpoint (no state_dict); give a .ckpt "
                              f"written by train.py, e.g. one of last.ckpt in {tmp_path}")


# ----------------------------------------------------------------------------- data, not code
def test_a_save_holds_plain_data_only_and_loads_weights_only(tmp_path):
    """What Lightning hands the IO (a DictConfig, Hydra's optimizer partial) is written as plain
    data: torch.load(weights_only=True) reads it back, the config as a dict, the partial as its node."""
    path = tmp_path / "last.ckpt"
    checkpoint = pickled(2.0)
    checkpoint["state_dict"] = torch.nn.Linear(2, 3).state_dict()  # keeps its _metadata
    checkpoint["callbacks"] = {"RngState": {"numpy": [np.int64(3), np.arange(3)]}}
    checkpoints.AtomicCheckpointIO().save_checkpoint(checkpoint, path)
    loaded = torch.load(path, weights_only=True)
    assert loaded["hyper_parameters"] == {
        "attention": {"name": "hnas"},
        "optimizer": {"_target_": "torch.optim.adamw.AdamW", "_partial_": True, "lr": 1e-3,
                      "weight_decay": 0.01}}
    assert loaded["state_dict"]._metadata == checkpoint["state_dict"]._metadata
    assert loaded["callbacks"]["RngState"]["numpy"][0] == 3
    assert torch.equal(loaded["callbacks"]["RngState"]["numpy"][1], torch.arange(3))
    assert trust.plain_data(checkpoint["state_dict"]) is checkpoint["state_dict"]  # no copy


def test_a_checkpoint_that_needs_unpickling_is_refused_in_one_line_and_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    path = save(tmp_path / "run" / "checkpoints" / "last.ckpt", {**lightning(), "x": Payload(marker)})
    with pytest.raises(DataError) as err:
        checkpoints.read(path)
    assert str(err.value) == (
        f"ckpt_path={path} holds pickled Python objects (posix.system), and loading them would run "
        f"code from the file; attnlab's own checkpoints hold tensors and plain data only. If you "
        f"trust whoever wrote it, load it with trust_checkpoint=true")
    assert not marker.exists()
    old = save(tmp_path / "old.ckpt", pickled(3.0))
    with pytest.raises(DataError, match=r"\(omegaconf\.dictconfig\.DictConfig\).*trust_checkpoint=true$"):
        checkpoints.read(old)
    trusted = checkpoints.read(old, trust=True)  # the opt-in: loaded as before
    assert trusted["hyper_parameters"]["attention"].name == "hnas"


def test_the_older_runs_fixtures_that_hold_objects_need_the_opt_in(tmp_path):
    refused = []
    for ckpt in sorted((FIXTURES / "checkpoints").glob("*/checkpoints/last.ckpt")):
        try:
            checkpoints.read(ckpt)
        except DataError as err:
            assert str(err).endswith("trust_checkpoint=true")
            refused.append(ckpt.parent.parent.name)
        assert "state_dict" in checkpoints.read(ckpt, trust=True)
    assert refused == ["classify", "lm", "mlm", "mt", "vqa"]  # headline's hyper-parameters were plain


# ----------------------------------------------------------------------------- run_config, origin
def run_dir(root: Path, task: str | None = "mlm", model: str | None = "hnas",
            where: str = "config.yaml") -> Path:
    """root/<where> holding a run config; root/checkpoints/last.ckpt beside it."""
    cfg = {"seed": 1, **({"task": {"name": task}} if task else {}),
           **({"model": {"name": model}} if model else {})}
    (root / where).parent.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(OmegaConf.create(cfg), root / where)
    return save(root / "checkpoints" / "last.ckpt", lightning())


def test_run_config_reads_the_run_dirs_config_or_hydras(tmp_path):
    ckpt = run_dir(tmp_path / "a")
    assert checkpoints.run_config(ckpt) == {"seed": 1, "task": {"name": "mlm"}, "model": {"name": "hnas"}}
    ckpt = run_dir(tmp_path / "b", task="lm", where=".hydra/config.yaml")
    assert checkpoints.run_config(ckpt).task.name == "lm"
    OmegaConf.save(OmegaConf.create({"task": {"name": "vqa"}}), tmp_path / "b" / "config.yaml")
    assert checkpoints.run_config(ckpt).task.name == "vqa"  # the run dir's own copy first
    # a config beside the checkpoint is not its run's: only <run>/checkpoints/x.ckpt -> <run>/
    OmegaConf.save(OmegaConf.create({"task": {"name": "mt"}}), tmp_path / "b" / "checkpoints" / "config.yaml")
    assert checkpoints.run_config(ckpt).task.name == "vqa"


def test_run_config_is_only_the_checkpoints_own_run_folders(tmp_path):
    """A config a folder or three up (a shared temp folder) says nothing about a checkpoint
    outside a run's checkpoints/ folder."""
    OmegaConf.save(OmegaConf.create({"task": {"name": "mt"}}), tmp_path / "config.yaml")
    for ckpt in (save(tmp_path / "a" / "last.ckpt", lightning()), save(tmp_path / "last.ckpt", lightning()),
                 save(tmp_path / "a" / "b" / "x.ckpt", lightning())):
        assert checkpoints.run_config(ckpt) is None
    assert checkpoints.run_config(save(tmp_path / "checkpoints" / "last.ckpt", lightning())).task.name == "mt"


# functions anywhere but the allowed ones, and classes outside the allowed packages (a process
# started by Popen, torch's other classes)
@pytest.mark.parametrize("target", ["torch.load", "os.system", "builtins.eval",
                                    "attnlab.files.atomic_write_text", "${oc.env:HOME}",
                                    "subprocess.Popen", "torch.utils.data.DataLoader"])
def test_a_foreign_target_in_a_run_config_is_refused_naming_the_key(target, tmp_path):
    ckpt = run_dir(tmp_path)
    OmegaConf.save(OmegaConf.create({"task": {"name": "mlm", "module": {"net": {
        "_target_": target, "f": str(ckpt), "weights_only": False}}}}), tmp_path / "config.yaml")
    saved = checkpoints.run_config(ckpt)  # read as data, nothing built
    assert checkpoints.run_config_file(ckpt) == tmp_path / "config.yaml"
    trust.check_targets(saved, "x", node="model")  # only what will be built is judged
    with pytest.raises(ConfigError) as err:
        trust.check_targets(saved, checkpoints.run_config_file(ckpt), node="task")
    shown = os.environ["HOME"] if target.startswith("$") else target
    assert str(err.value).startswith(f"{tmp_path / 'config.yaml'}: task.module.net._target_={shown} is "
                                     f"not a class attnlab builds")


def test_the_targets_attnlab_writes_pass(tmp_path):
    """Classes of attnlab, the tasks, torch's optimizers and Lightning; the LR schedules'
    functions; and every _target_ of every task's composed config (lists included)."""
    from hydra import compose, initialize_config_dir

    from attnlab import config_args

    config_args.register(CONF)
    with initialize_config_dir(str(CONF), version_base="1.3"):
        for task in sorted(p.stem for p in (CONF / "task").glob("*.yaml")):
            cfg = compose("train", overrides=[f"task={task}", "logger=many", f"paths.output_dir={tmp_path}"])
            trust.check_targets(OmegaConf.create(OmegaConf.to_container(cfg, resolve=True)), task)
    trust.check_targets(OmegaConf.create({"trainer": {"plugins": [
        {"_target_": "attnlab.checkpoints.AtomicCheckpointIO"}]}, "s": {
        "_target_": "tasks.common.optim.linear_schedule", "_partial_": True}}), "x")
    with pytest.raises(ConfigError, match=r"trainer\.plugins\[1\]\._target_=subprocess\.run"):
        trust.check_targets(OmegaConf.create({"trainer": {"plugins": [
            {"_target_": "attnlab.checkpoints.AtomicCheckpointIO"}, {"_target_": "subprocess.run"}]}}), "x")


def test_origin_from_the_run_config_then_the_hyper_parameters(tmp_path):
    ckpt = run_dir(tmp_path / "a", task="mlm", model="unas")
    assert checkpoints.origin(ckpt, lightning()) == {"task": "mlm", "model": "unas"}  # config wins
    ckpt = run_dir(tmp_path / "b", task="lm", model=None)
    assert checkpoints.origin(ckpt, lightning()) == {"task": "lm", "model": "hnas"}
    ckpt = run_dir(tmp_path / "c", task=None, model=None)
    assert checkpoints.origin(ckpt, lightning()) == {"model": "hnas"}
    ckpt = run_dir(tmp_path / "d", task=None, model="7", where="x.yaml")  # no run config
    assert checkpoints.origin(ckpt, {"hyper_parameters": {"attention": {"name": 7}}}) == {"model": "7"}
    for hparams in (None, {}, {"attention": "hnas"}, {"attention": {"name": ""}}, {"attention": {}}):
        assert checkpoints.origin(ckpt, {"state_dict": {}, "hyper_parameters": hparams}) == {}
    assert checkpoints.origin(ckpt, {"state_dict": {}}) == {}
    OmegaConf.save(OmegaConf.create({"task": {"name": 3}}), tmp_path / "d" / "config.yaml")
    assert checkpoints.origin(ckpt, {}) == {"task": "3"}  # names as text


def test_check_run_accepts_the_same_or_unknown_and_names_both_runs_otherwise(tmp_path):
    checkpoints.check_run(tmp_path / "elsewhere.ckpt", {}, "vqa", "dnas")  # nothing known: trusted
    checkpoints.check_run(tmp_path / "elsewhere.ckpt", lightning(), "vqa", "hnas")  # the same model
    ckpt = run_dir(tmp_path / "run", task="mlm", model="hnas")
    checkpoints.check_run(ckpt, lightning(), "mlm", "hnas")
    for task, model in (("mlm", "unas"), ("lm", "hnas")):
        with pytest.raises(ConfigError) as err:
            checkpoints.check_run(ckpt, lightning(), task, model)
        assert str(err.value) == (f"ckpt_path={ckpt} is a checkpoint of task=mlm model=hnas, this run is "
                                  f"task={task} model={model}; resume it with task=mlm model=hnas, or "
                                  "start without ckpt_path")


# ----------------------------------------------------------------------------- check_fits
class Net(torch.nn.Module):
    def __init__(self, width: int = 3, extra: bool = False):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(width, 2), torch.nn.Linear(2, 2))
        if extra:
            self.head = torch.nn.Linear(2, 1)


def test_check_fits_accepts_the_same_weights_under_old_or_new_names(tmp_path):
    weights = Net().state_dict()
    checkpoints.check_fits(tmp_path / "a.ckpt", {"state_dict": weights}, Net())
    old = {"model." + k[len("net."):]: v for k, v in weights.items()}
    checkpoints.check_fits(tmp_path / "a.ckpt", {"state_dict": old}, Net())


def test_check_fits_counts_and_names_missing_unexpected_and_reshaped_weights(tmp_path):
    ckpt = run_dir(tmp_path, task="classify", model="hnas")
    theirs = {**Net(width=5).state_dict(), "other.weight": torch.zeros(1), "other.bias": torch.zeros(1)}
    with pytest.raises(ConfigError) as err:
        checkpoints.check_fits(ckpt, {"state_dict": theirs}, Net(extra=True))
    assert str(err.value) == (
        f"ckpt_path={ckpt} does not fit this model: 2 of this model's weights are not in it (e.g. "
        "head.weight); 2 of its weights are not in this model (e.g. other.weight); 1 have another shape "
        "(e.g. net.0.weight: (2, 5) there, (2, 3) here); resume with the task and model options it was "
        "trained with (task=classify model=hnas), or start without ckpt_path")


@pytest.mark.parametrize("case", ["missing", "unexpected", "reshaped"])
def test_check_fits_says_only_what_is_wrong_and_no_origin_when_unknown(case, tmp_path):
    theirs = Net().state_dict()
    module = Net(extra=case == "missing")
    if case == "unexpected":
        theirs["net.2.weight"] = torch.zeros(2)
    if case == "reshaped":
        theirs["net.1.bias"] = torch.zeros(4)
        theirs["net.0.bias"] = torch.zeros(1)
    part = {"missing": "2 of this model's weights are not in it (e.g. head.weight)",
            "unexpected": "1 of its weights are not in this model (e.g. net.2.weight)",
            "reshaped": "2 have another shape (e.g. net.0.bias: (1,) there, (2,) here)"}[case]
    path = tmp_path / "x.ckpt"
    with pytest.raises(ConfigError) as err:
        checkpoints.check_fits(path, {"state_dict": theirs}, module)
    assert str(err.value) == (f"ckpt_path={path} does not fit this model: {part}; resume with the task "
                              "and model options it was trained with, or start without ckpt_path")


# ----------------------------------------------------------------------------- older layouts
def test_upgrade_state_dict_renames_model_to_net_and_nothing_else():
    today = {"net.a": torch.zeros(1), "modelx": 1, "models.w": 2}  # today's names: as they are
    assert checkpoints.upgrade_state_dict(today) is today
    w = torch.ones(2)
    old = {"model.enc.model.w": w, "submodel.x": 1, "u": 2, "net.y": 3}
    assert checkpoints.upgrade_state_dict(old) == {"net.enc.model.w": w, "submodel.x": 1, "u": 2, "net.y": 3}
    assert list(checkpoints.upgrade_state_dict(old)) == ["net.enc.model.w", "submodel.x", "u", "net.y"]


def fixture_config(task: str) -> DictConfig:
    """tests/fixtures/checkpoints/<task>/config.yaml, a real run config of the old layout."""
    text = (FIXTURES / "checkpoints" / task / "config.yaml").read_text()
    for mark in re.findall(r"@[A-Z_]+@", text):
        text = text.replace(mark, f"/x/{mark.strip('@').lower()}")
    return OmegaConf.create(text)


def test_a_flat_old_module_is_rebuilt_in_todays_layout():
    saved = fixture_config("classify")
    old = OmegaConf.to_container(saved.task.module)
    up = checkpoints.upgrade_module_config(saved, CONF)
    current = OmegaConf.load(CONF / "task" / "classify.yaml").task.module
    module = up.task.module
    assert list(module) == list(current)  # today's node, its keys in today's order
    assert module.net._target_ == current.net._target_ == "tasks.classify.model.SelfAttentiveClassifier"
    assert module.optimizer._target_ == current.optimizer._target_
    for key in ("encoder", "embed_dim", "hidden_dim", "d_model", "nhead", "hops", "fc_dim", "dropout"):
        assert module.net[key] == old[key], key  # the old run's value, not today's default
    assert module.net.attention == old["attention"]
    assert module.optimizer.lr == old["lr"] and module.optimizer.weight_decay == old["weight_decay"]
    assert module.penalty == old["penalty"] and module.heatmap_max_tokens == old["heatmap_max_tokens"]
    assert module.net.pretrained_layers is None  # not in the old run: today's default
    assert "hybrid_lr" not in module and "lr" not in module
    assert "${" not in OmegaConf.to_yaml(module)  # resolved: no interpolation left to a new root
    assert module.scheduler.factor == current.scheduler.factor
    # the rest of the run config is the old run's, and the saved one is not changed
    assert up.task.datamodule == saved.task.datamodule and up.seed == saved.seed == 7
    assert saved.task.module == old and "hybrid_lr" in saved.task.module


def test_the_upgraded_module_stands_alone_and_the_rest_keeps_its_interpolations():
    # a run of the old layout without the module's own `penalty` (today's node takes it from
    # ${task.penalty}), and its config as Hydra saved it (.hydra/config.yaml: not resolved)
    saved = fixture_config("classify")
    del saved.task.module["penalty"]
    saved.task.penalty = 0.25
    saved.paths.output_dir = "${hydra:runtime.output_dir}"
    up = checkpoints.upgrade_module_config(saved, CONF)
    assert OmegaConf.to_container(up.task.module)["penalty"] == 0.25  # resolved, not "${task.penalty}"
    # eval.py merges dotted task.* overrides into the task node alone: it must not need the root
    merged = OmegaConf.merge(up.task, OmegaConf.from_dotlist(["module.optimizer.lr=0.5"]))
    assert merged.module.penalty == 0.25 and merged.module.optimizer.lr == 0.5
    # the rest of the run config is copied as it was: Hydra's interpolations are not resolved
    assert OmegaConf.to_container(up)["paths"]["output_dir"] == "${hydra:runtime.output_dir}"
    today = OmegaConf.create({"paths": {"output_dir": "${hydra:runtime.output_dir}"},
                              "task": {"name": "classify", "module": {"net": {}, "hybrid_lr": 1}}})
    up = checkpoints.upgrade_module_config(today, CONF)
    assert OmegaConf.to_container(up) == {"paths": {"output_dir": "${hydra:runtime.output_dir}"},
                                          "task": {"name": "classify", "module": {"net": {}}}}


@pytest.mark.parametrize("task", ["headline", "lm", "mlm", "mt", "vqa"])
def test_every_old_fixture_gets_todays_network_with_its_sizes(task):
    saved = fixture_config(task)
    old = OmegaConf.to_container(saved.task.module)
    module = checkpoints.upgrade_module_config(saved, CONF).task.module
    current = OmegaConf.load(CONF / "task" / f"{task}.yaml").task.module
    assert module.net._target_ == current.net._target_
    width = "embed_dim" if task == "vqa" else "d_model"
    assert module.net[width] == old[width] and module.net.attention == old["attention"]
    assert module.optimizer.lr == old["lr"] and "hybrid_lr" not in OmegaConf.to_yaml(module)


def test_todays_config_passes_unchanged_but_for_hybrid_lr():
    saved = OmegaConf.create({"task": {"name": "classify", "module": {"net": {"d_model": 4}, "lr": 1}}})
    assert checkpoints.upgrade_module_config(saved, CONF) is saved
    no_module = OmegaConf.create({"task": {"name": "classify"}, "seed": 1})
    assert checkpoints.upgrade_module_config(no_module, CONF) is no_module
    saved.task.module.hybrid_lr = 0.05
    up = checkpoints.upgrade_module_config(saved, CONF)
    assert up == {"task": {"name": "classify", "module": {"net": {"d_model": 4}, "lr": 1}}}
    assert "hybrid_lr" in saved.task.module  # the caller's config is not changed


def test_an_old_module_whose_task_has_no_nested_node_today_is_left_as_it_was(tmp_path):
    (tmp_path / "task").mkdir()
    saved = OmegaConf.create({"task": {"name": "flat", "module": {"lr": 1, "hybrid_lr": 2}}})
    OmegaConf.save(OmegaConf.create({"task": {"module": {"lr": 3}}}), tmp_path / "task" / "flat.yaml")
    assert checkpoints.upgrade_module_config(saved, tmp_path) == {"task": {"name": "flat", "module": {"lr": 1}}}
    OmegaConf.save(OmegaConf.create({"task": {"name": "flat"}}), tmp_path / "task" / "flat.yaml")
    assert checkpoints.upgrade_module_config(saved, tmp_path) == {"task": {"name": "flat", "module": {"lr": 1}}}
    saved.task.name = "gone"
    with pytest.raises(DataError, match=rf"^task={re.escape(str(tmp_path / 'task' / 'gone.yaml'))} does "
                                        r"not exist; give an existing file$"):
        checkpoints.upgrade_module_config(saved, tmp_path)


def test_a_config_from_before_its_yaml_named_a_required_argument_gets_todays_value():
    """headline's layer style was Seq2SeqTransformer's defaults until d1d4fbb put it in the YAML;
    the class takes no default for it today (the YAML is its home), so an older run's config gets
    it from today's conf/task/headline.yaml (the defaults it was built with). A complete config,
    and what the saved one names, pass unchanged."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=["task=headline", "model=hnas", "logger=none",
                                          "paths.output_dir=/x/run"])
    saved = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    assert checkpoints.upgrade_module_config(saved, CONF) == saved
    style = {"activation": "gelu", "layer_norm_eps": 1e-12, "positions": "learned", "lm_head": True,
             "weight_init": "bert"}
    for key in style:
        del saved.task.module.net[key]
    saved.task.module.net.d_model = 8  # the run's own value stays
    old = OmegaConf.to_container(saved)
    up = checkpoints.upgrade_module_config(saved, CONF)
    assert {k: up.task.module.net[k] for k in style} == style
    assert up.task.module.net.d_model == 8 and up.task.datamodule == saved.task.datamodule
    assert OmegaConf.to_container(saved) == old  # the saved config itself is not changed


def test_set_by_name_sets_own_and_injected_options_and_says_which():
    node = OmegaConf.create({
        "_target_": "M", "dropout": 0.1, "lr": 9, "head": {"size": 1},
        "net": {"_target_": "N", "d_model": 8, "dropout": 0.0, "inner": {"_target_": "I", "k": 1}},
        "optimizer": {"_target_": "O", "_partial_": True, "lr": 0.1},
    })
    used = checkpoints.set_by_name(node, {"dropout": 0.5, "lr": 2e-3, "k": 4, "d_model": 16,
                                          "_target_": "X", "_partial_": False, "head": {"size": 2},
                                          "size": 3, "unused": 1})
    assert used == {"dropout", "lr", "k", "d_model", "head"}
    assert OmegaConf.to_container(node) == {
        "_target_": "M", "dropout": 0.5, "lr": 2e-3, "head": {"size": 2},  # a plain dict: set whole
        "net": {"_target_": "N", "d_model": 16, "dropout": 0.5, "inner": {"_target_": "I", "k": 4}},
        "optimizer": {"_target_": "O", "_partial_": True, "lr": 2e-3},
    }
    assert checkpoints.set_by_name(OmegaConf.create({"a": 1}), {}) == set()


# ----------------------------------------------------------------------------- resolve_ckpt_path
def run_cfg(tmp_path: Path, ckpt_path) -> DictConfig:
    return OmegaConf.create({"ckpt_path": ckpt_path, "task": {"name": "mlm"}, "model": {"name": "hnas"},
                             "paths": {"log_dir": str(tmp_path / "outputs"),
                                       "output_dir": str(tmp_path / "outputs" / "mlm" / "hnas" / "now")}})


def touch_ckpt(path: Path, mtime: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    os.utime(path, (mtime, mtime))
    return path


def test_a_resume_runs_in_the_run_folder_of_its_checkpoint_and_nothing_else_does(tmp_path):
    """Hydra's run dir (`resume_dir`): a checkpoint in `<run>/checkpoints/` beside the run's
    config.yaml (or `last`: the newest of the new dir's siblings) -> that run; else the new dir."""
    new = str(tmp_path / "vqa" / "hnas" / "now")
    older, newer = (run_dir(tmp_path / "vqa" / "hnas" / name) for name in ("b", "a"))
    os.utime(older, (1, 1))  # "b" sorts after "a" but is the older
    assert checkpoints.resume_dir(new, str(older)) == str(older.parent.parent)
    assert checkpoints.resume_dir(new, "last") == str(newer.parent.parent)
    assert checkpoints.resume_dir(new, None) == new and checkpoints.resume_subdir(None, "t") == ".hydra"
    assert checkpoints.resume_subdir(str(older), "t") == ".hydra/resume-t"
    loose = tmp_path / "loose.ckpt"
    loose.write_bytes(b"x")
    (newer.parent.parent / "config.yaml").unlink()
    assert checkpoints.resume_dir(new, str(loose)) == new  # not in a run's checkpoints/ folder
    assert checkpoints.resume_dir(new, str(newer)) == new  # its run folder has no config.yaml


def test_resolve_ckpt_path_none_or_a_file(tmp_path):
    assert resolve_ckpt_path(run_cfg(tmp_path, None)) is None
    assert resolve_ckpt_path(run_cfg(tmp_path, "")) is None
    assert resolve_ckpt_path(OmegaConf.create({"seed": 1})) is None
    ckpt = touch_ckpt(tmp_path / "a" / "epoch_3.ckpt", 1e9)
    assert resolve_ckpt_path(run_cfg(tmp_path, str(ckpt))) == str(ckpt)
    with pytest.raises(DataError) as err:
        resolve_ckpt_path(run_cfg(tmp_path, str(tmp_path / "b.ckpt")))
    assert str(err.value) == (f"ckpt_path={tmp_path / 'b.ckpt'} does not exist; give an existing file, "
                              "e.g. ckpt_path=last")
    with pytest.raises(DataError, match=r"is a directory, not a file; give a file, e.g. ckpt_path=last$"):
        resolve_ckpt_path(run_cfg(tmp_path, str(tmp_path / "a")))  # a folder but not a run's


def test_resolve_ckpt_path_a_run_directory_names_its_checkpoint(tmp_path):
    run = tmp_path / "outputs" / "mlm" / "hnas" / "old"
    touch_ckpt(run / "checkpoints" / "last.ckpt", 1e9)
    with pytest.raises(ConfigError) as err:
        resolve_ckpt_path(run_cfg(tmp_path, str(run)))
    assert str(err.value) == (f"ckpt_path={run} is a run directory, not a file; give its checkpoint, "
                              f"e.g. ckpt_path={run / 'checkpoints' / 'last.ckpt'}")


def test_resolve_ckpt_path_last_prefers_this_run_then_the_newest_of_its_task_and_model(tmp_path):
    cfg = run_cfg(tmp_path, "last")
    root = tmp_path / "outputs" / "mlm" / "hnas"
    with pytest.raises(ConfigError) as err:
        resolve_ckpt_path(cfg)
    assert str(err.value) == (f"ckpt_path=last: no last.ckpt under {root}/*/checkpoints/; start without "
                              "ckpt_path, or pass ckpt_path=<path to a .ckpt>")
    touch_ckpt(tmp_path / "outputs" / "mlm" / "unas" / "x" / "checkpoints" / "last.ckpt", 3e9)  # other model
    touch_ckpt(tmp_path / "outputs" / "lm" / "hnas" / "x" / "checkpoints" / "last.ckpt", 3e9)  # other task
    touch_ckpt(root / "sweep" / "0" / "checkpoints" / "last.ckpt", 3e9)  # not a run dir of this pattern
    touch_ckpt(root / "z" / "checkpoints" / "epoch_1.ckpt", 3e9)
    with pytest.raises(ConfigError, match="no last.ckpt under"):
        resolve_ckpt_path(cfg)
    middle = touch_ckpt(root / "b" / "checkpoints" / "last.ckpt", 2e9)
    touch_ckpt(root / "a" / "checkpoints" / "last.ckpt", 1e9)
    touch_ckpt(root / "c" / "checkpoints" / "last.ckpt", 1.5e9)
    assert resolve_ckpt_path(cfg) == str(middle)  # the newest by mtime, not by name
    here = touch_ckpt(root / "now" / "checkpoints" / "last.ckpt", 1)  # this run's own, however old
    assert resolve_ckpt_path(cfg) == str(here)


# ----------------------------------------------------------------------------- what runs write
@pytest.mark.parametrize("task", sorted(CARDS))
def test_every_checkpoint_a_run_writes_loads_weights_only(task, tmp_path, data_dir, one_thread):
    """A tiny run of each task, in process: the best and the last checkpoint (written mid-epoch
    too) and what trainer.save_checkpoint writes load with torch.load(weights_only=True). (The
    preemption and sweep jobs' checkpoints: tests/e2e/test_cli.py.)"""
    from hydra import compose, initialize_config_dir

    from attnlab import runner

    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=[f"task={task}", "logger=none", "test=false",
                                          f"paths.output_dir={tmp_path}", f"paths.data_dir={data_dir}",
                                          *TINY[task], "callbacks.last_checkpoint.every_n_train_steps=1"])
    runner.train(cfg)
    written = sorted(p.name for p in (tmp_path / "checkpoints").glob("*.ckpt"))
    assert "last.ckpt" in written and any(n.startswith("best-") for n in written), written
    for name in written:
        ckpt = torch.load(tmp_path / "checkpoints" / name, weights_only=True, map_location="cpu")
        assert ckpt["state_dict"] and isinstance(ckpt["hyper_parameters"], dict)


def test_eval_of_a_checkpoint_composes_its_own_task(tmp_path):
    """eval.py ckpt_path=... task.eval_lengths=[1,4]: the run's task is added before Hydra
    composes (else eval.yaml's default task would not have the key); never over a given task=."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create({"task": {"name": "lm"}}), run / "config.yaml")
    ckpt = f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}"
    assert checkpoints.task_argument([ckpt, "task.eval_lengths=[1,4]"]) == ["task=lm"]
    assert checkpoints.task_argument([ckpt, "task=mt"]) == []
    assert checkpoints.task_argument([f"ckpt_path={tmp_path / 'x.ckpt'}"]) == []  # no run folder
    OmegaConf.save(OmegaConf.create({"task": {"name": "lm; rm -rf"}}), run / "config.yaml")
    assert checkpoints.task_argument([ckpt]) == []  # a name is a config group option, nothing else

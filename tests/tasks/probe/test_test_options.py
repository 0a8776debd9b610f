"""probe.test_options: test cells that change only the test data (tasks/probe/datamodule.py), their
metrics per cell (tasks/probe/module.py) against a count by hand, and the network's positions
(tasks/probe/network.py): a learned table refused past its length, sinusoidal against the formula."""

import math
from functools import partial

import numpy as np
import pytest
import pytorch_lightning as pl
import torch

from attnlab.attention import record_attention
from attnlab.errors import ConfigError
from tasks.probe.data import IGNORE
from tasks.probe.datamodule import BATCH_FIELDS, ProbeDataModule, cell_name
from tasks.probe.module import GRID_PNG, ProbeModule
from tasks.probe.network import ProbeEncoder, sinusoidal

NEEDLE = {"variant": "single", "length": 32, "num_keys": 6, "num_values": 6, "num_filler": 6}
SIZES = {"n_train": 32, "n_val": 16, "n_test": 24, "eval_batch_size": 16, "batch_size": 16,
         "data_seed": 0, "seed": None}


def needle(test_options=None, **options) -> ProbeDataModule:
    dm = ProbeDataModule("needle", {**NEEDLE, **options}, **SIZES, test_options=test_options)
    dm.setup()
    return dm


def module_for(dm: ProbeDataModule, positions: str = "none") -> ProbeModule:
    kw = dm.model_kwargs()
    torch.manual_seed(0)
    net = ProbeEncoder(kw["num_classes"], kw["seq_len"], kw["vocab_size"], kw["input_dim"],
                       attention="unas", d_model=16, nhead=2, num_layers=1, dim_feedforward=16,
                       positions=positions)
    return ProbeModule(net, partial(torch.optim.AdamW, lr=3e-3), target_kind=kw["target_kind"],
                       baselines=kw["baselines"], baseline_name=kw["baseline_name"],
                       shortcuts=kw["shortcuts"], test_grid=kw["test_grid"],
                       test_length=kw["test_length"])


def test_test_options_leave_train_val_and_test_as_they_were():
    """Byte-identical splits with and without test_options; the cells are drawn apart, each with
    the cell's options (its length), n_test rows, and seeds of their own."""
    plain = needle()
    grid = needle({"length": [32, 64], "depth": [0.0, 1.0]})
    for split in ("train", "val", "test"):
        for name in BATCH_FIELDS:
            a, b = plain.splits[split].fields.get(name), grid.splits[split].fields.get(name)
            assert (a is None) == (b is None), (split, name)
            if a is not None:
                assert a.dtype == b.dtype and a.numpy().tobytes() == b.numpy().tobytes(), (split, name)
    assert plain.baselines == {k: v for k, v in grid.baselines.items() if "@" not in k}
    assert plain.shortcuts == {k: v for k, v in grid.shortcuts.items() if "@" not in k}
    assert list(grid.cell_splits) == ["length=32,depth=0.0", "length=32,depth=1.0",
                                      "length=64,depth=0.0", "length=64,depth=1.0"]
    for name, split in grid.cell_splits.items():
        length = 32 if "length=32" in name else 64
        assert split.inputs.shape == (SIZES["n_test"], length)
    # a cell with the training options is a fresh draw, not the test split again
    same = grid.cell_splits["length=32,depth=0.0"].inputs
    assert not torch.equal(same, grid.splits["test"].inputs)
    assert not torch.equal(same[:, 4:], grid.cell_splits["length=32,depth=1.0"].inputs[:, 4:])


def test_a_scalar_is_a_list_of_one_and_null_drops_an_option():
    dm = needle({"length": 48, "depth": None})
    assert list(dm.cell_splits) == ["length=48"]
    assert dm.model_kwargs()["test_grid"] == {"length": [48]}
    assert dm.model_kwargs()["test_length"] == 48


@pytest.mark.parametrize("options, says", [
    ({"num_objects": [8, 16]}, ("num_objects is not an option of the needle generator; use one "
                                "of variant, length, depth,")),
    ({"length": []}, "probe.test_options.length lists no value"),
    ({"length": [8]}, "probe.test_options cell length=8 of needle: length=8 is too short"),
    ({"num_values": [12]}, "has 12 classes"),
    ([4, 8], "is not a mapping"),
])
def test_a_bad_test_option_is_refused_in_one_line(options, says):
    with pytest.raises(ConfigError) as err:
        needle(options)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_learned_positions_refuse_a_longer_test_in_one_line():
    dm = needle({"length": [32, 64]})
    with pytest.raises(ConfigError) as err:
        module_for(dm, positions="learned")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("probe.test_options={length:[32,64]} asks for 64 positions but "
                              "task.module.net.positions=learned has a table of 32")
    assert "positions=none|sinusoidal" in message
    for positions in ("none", "sinusoidal"):
        module_for(dm, positions=positions)  # they take any length
    module_for(needle({"length": [16 + 16]}), positions="learned")  # not longer: fine


def test_sinusoidal_positions_are_the_transformer_formula():
    """float64 by the paper's formula: PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos(...)."""
    for d in (6, 7):
        table = sinusoidal(40, d).double()
        for p in (0, 1, 17, 39):
            for j in range(d):
                angle = p / 10000 ** ((j - j % 2) / d)
                expected = math.sin(angle) if j % 2 == 0 else math.cos(angle)
                assert table[p, j].item() == pytest.approx(expected, abs=1e-5)
    with pytest.raises(ConfigError, match="learned, sinusoidal, none"):
        ProbeEncoder(4, 8, 8, attention="unas", d_model=8, nhead=2, num_layers=1,
                     dim_feedforward=8, positions="rope")


def by_hand(module: ProbeModule, split) -> dict[str, float]:
    """A cell's accuracy, answers, sequence accuracy and target mass, counted one row at a time
    (float64): the mass is the first layer's weight, mean over heads, on read_at and the next."""
    fields = split.fields
    right = answers = seq_right = 0
    masses = []
    with torch.no_grad():
        for row in range(len(split)):
            batch = {k: v[row : row + 1] for k, v in fields.items()}
            with record_attention(module.net) as recorder:
                logits = module.logits(batch)[0].double()
            weights = recorder.records["layers.0.self_attn"].weights[0].double()  # (H, L, L)
            all_right = True
            for q in range(fields["targets"].shape[1]):
                target = int(fields["targets"][row, q])
                if target == IGNORE:
                    continue
                answers += 1
                hit = int(logits[q].argmax()) == target
                right += hit
                all_right &= hit
                k = int(fields["read_at"][row, q])
                masses.append(float((weights[:, q, k] + weights[:, q, k + 1]).mean()))
            seq_right += all_right
    return {"acc": right / answers, "answers": answers, "seq_acc": seq_right / len(split),
            "target_mass": float(np.mean(masses))}


def test_each_cell_logs_its_metrics_counted_by_hand(tmp_path, one_thread):
    """Untrained (the counts do not need learning), every cell's acc, seq_acc, answers and target_mass equal a count by hand
    on the cell's rows; its baseline (chance) and shortcut are logged beside; the ordinary test
    keys are still there; the grid's heat map is written in the run dir."""
    dm = needle({"length": [32, 64], "depth": [0.0, 0.5]}, variant="multivalue", num_needles=1,
                num_strays=0)
    module = module_for(dm)
    trainer = pl.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, default_root_dir=tmp_path)
    trainer.test(module, datamodule=dm, verbose=False)
    logged = {k: float(v) for k, v in trainer.callback_metrics.items()}
    for key in ("test/acc", "test/seq_acc", "test/answers", "test/target_mass"):
        assert key in logged
    for name, split in dm.cell_splits.items():
        expected = by_hand(module, split)
        assert expected["answers"] == 2 * SIZES["n_test"]  # two values asked per row
        for metric, value in expected.items():
            assert logged[f"test/{metric}@{name}"] == pytest.approx(value, abs=1e-6), (name, metric)
        assert logged[f"test/baseline_acc@{name}"] == pytest.approx(1 / NEEDLE["num_values"])
        assert f"test/shortcut_acc@{name}" in logged and f"test/loss@{name}" in logged
    assert (tmp_path / GRID_PNG).stat().st_size > 1000
    assert sum("@" in k for k in logged) == 4 * 7  # 4 cells x 7 metrics, nothing else


def test_cell_name_is_what_compare_reads():
    from attnlab.study.compare.generalization import cell_name as compare_name

    cell = {"length": 512, "depth": 0.25, "variant": "single"}
    assert cell_name(cell) == compare_name(cell) == "length=512,depth=0.25,variant=single"

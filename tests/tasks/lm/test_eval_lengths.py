"""task.eval_lengths: the test split scored at multiples of the training length, per position
bucket, against a plain float64 loop over the windows; every token once, at every length, also
under DDP; the CLI's metrics, PNG, and one-line refusals."""

import copy
import json
import math

import pytest
import pytorch_lightning as pl
import torch
from helpers.cards import TINY
from helpers.cli import QUIET, metrics_files, run_cli, run_here
from helpers.modules import task_module
from helpers.paths import FIXTURES
from omegaconf import OmegaConf

from attnlab.errors import ConfigError
from tasks.lm.datamodule import LMDataModule
from tasks.lm.lengths import PNG_NAME

BLOCK = 8
LENGTHS = [1, 2, 4, 8]
TEST_TOKENS = 27  # the fixture's test split (tests/fixtures/lm/wikitext/wiki.test.tokens)
# the tiny CLI runs: blocks of 16 (card.tiny), no overlap (test/loss is then the 1x loss), a
# table of positions that covers 4x, the analyses that do not concern this off
CLI = ["task=lm", "model=unas", *TINY["lm"], *QUIET, "task.eval_stride=null",
       "task.module.net.max_positions=64", "callbacks=minimal", "task.module.sample_prompts=0"]


def datamodule(**kwargs) -> LMDataModule:
    dm = LMDataModule(source="wikitext", data_dir=str(FIXTURES / "lm" / "wikitext"), debian_dir="unused",
                      block_size=BLOCK, eval_stride=None, eval_batch_size=2, seed=42, cache_dir=None,
                      **kwargs)
    dm.prepare_data()
    dm.setup("fit")
    return dm


@torch.no_grad()
def plain_buckets(net: torch.nn.Module, stream: torch.Tensor, eos: int, multiple: int) -> tuple[list, list]:
    """(sum of -log p, tokens) per bucket, token by token in float64: consecutive windows of
    multiple * BLOCK targets, the last one ending at the end of the text and reaching back a whole
    window (its earlier targets context only); position = place in the window."""
    width, n = multiple * BLOCK, len(stream)
    x = torch.cat([torch.tensor([eos]), stream])  # input i is s[i - 1]: [eos] first
    nll, tokens = [0.0] * multiple, [0] * multiple
    for first in range(0, n, width):
        end = min(first + width, n)
        start = max(0, end - width)
        logits = net.logits(net(x[start:end][None]))[0]
        log_probs = logits - logits.logsumexp(-1, keepdim=True)  # log-softmax, by hand
        for t in range(first, end):
            bucket = (t - start) // BLOCK
            nll[bucket] -= float(log_probs[t - start, stream[t]])
            tokens[bucket] += 1
    return nll, tokens


def test_every_test_token_once_per_length_and_bucket_losses_against_a_plain_loop(tmp_path):
    dm = datamodule(eval_lengths=[4, 1, 8, 2, 1])  # any order, repeats: each length once, shortest first
    assert dm.eval_lengths == LENGTHS
    # batches of eval_batch_size // m windows, at least one: the memory of a 1x batch
    assert [dm.length_loader(m).batch_size for m in LENGTHS] == [2, 1, 1, 1]
    torch.manual_seed(0)
    module = task_module("lm", {"scheme": "unas"}, data=dm.model_kwargs(), d_model=16, nhead=2,
                         num_layers=2, dim_feedforward=32, dropout=0.0, adaptive_cutoffs=None,
                         max_positions=max(LENGTHS) * BLOCK, sample_prompts=1, prompt_length=4,
                         sample_length=max(LENGTHS) * BLOCK)  # as many new tokens as positions: cut to fit
    trainer = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", default_root_dir=tmp_path)
    result = trainer.test(module, datamodule=dm, verbose=False)[0]

    # 27 test tokens, blocks of 8. 1x: windows [0,8) [8,16) [16,24), then [19,27) scoring 24..26
    # at positions 5..7; 2x: [0,16), then [11,27) scoring 16..26 at positions 5..15; 4x and 8x:
    # one window of all 27 (shorter than the window), positions 0..26
    expected = {1: [27], 2: [8 + 3, 8 + 8], 4: [8, 8, 8, 3], 8: [8, 8, 8, 3, 0, 0, 0, 0]}
    reference = copy.deepcopy(module.net).double().eval()
    stream = torch.from_numpy(dm.streams["test"]).long()
    assert len(stream) == TEST_TOKENS
    for m in LENGTHS:
        counts = [result[f"test/tokens@{m}/bucket{b}"] for b in range(m)]
        assert counts == expected[m] and result[f"test/tokens@{m}"] == sum(counts) == TEST_TOKENS
        nll, tokens = plain_buckets(reference, stream, dm.eos_id, m)
        assert tokens == expected[m]
        for b in range(m):
            if tokens[b]:
                assert result[f"test/loss@{m}/bucket{b}"] == pytest.approx(nll[b] / tokens[b], rel=2e-6)
            else:  # no token at those positions: no loss, not a NaN
                assert f"test/loss@{m}/bucket{b}" not in result
        assert result[f"test/loss@{m}"] == pytest.approx(sum(nll) / TEST_TOKENS, rel=2e-6)
        assert result[f"test/ppl@{m}"] == pytest.approx(math.exp(sum(nll) / TEST_TOKENS), rel=2e-6)
    # the buckets differ (the mechanism shows): a bucket mixed up with another would not match
    assert len({round(result[f"test/loss@4/bucket{b}"], 4) for b in range(4)}) == 4
    assert (tmp_path / PNG_NAME).stat().st_size > 0
    assert "1 test prompts of 1 tokens, 63 new tokens" in (tmp_path / "predictions.txt").read_text()


@pytest.mark.parametrize("value", ["0", "x", "[3.5]", "[1,0]"])
def test_a_bad_eval_lengths_is_refused_in_one_line(value, tmp_path, data_dir):
    proc = run_here([*CLI, f"task.eval_lengths={value}"], tmp_path, data_dir, check=False)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr
    message = " ".join(proc.stderr.split())  # rich wraps long lines
    assert f"task.eval_lengths={value}" in message and "task.eval_lengths=[1,2,4,8]" in message
    assert "Traceback" not in proc.stderr + proc.stdout


@pytest.mark.parametrize("value", [[], [2.0], [True], "1"])
def test_the_datamodule_refuses_what_is_not_a_list_of_positive_integers(value):
    with pytest.raises(ConfigError, match=r"^task\.eval_lengths=.*expected null or a non-empty list"):
        LMDataModule(source="debian", debian_dir="unused", eval_stride=None, eval_batch_size=None,
                     seed=0, cache_dir=None, eval_lengths=value)


def test_learned_positions_asked_for_8x_are_refused_before_training(tmp_path, data_dir):
    args = [a for a in CLI if not a.startswith("task.module.net.max_positions")]  # a table of 16
    proc = run_here([*args, "task.module.net.positions=learned", "task.eval_lengths=[1,8]"],
                    tmp_path, data_dir, check=False)
    assert proc.returncode == 2, proc.stderr
    message = " ".join(proc.stderr.split())
    assert "task.eval_lengths=[1,8]" in message and "learned" in message and "128" in message
    assert len([line for line in proc.stderr.splitlines() if line.startswith("error: ")]) == 1
    assert not list((tmp_path / "outputs").rglob("*.ckpt"))  # nothing trained


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_dir):
    """One tiny run that tests at 1x and 2x at its end (its run dir)."""
    tmp = tmp_path_factory.mktemp("trained")
    proc = run_here([*CLI, "task.eval_lengths=[1,2]"], tmp, data_dir)
    [record] = [r for r in metrics_files(tmp / "outputs") if r["status"] == "ok"]
    return record | {"_stdout": proc.stdout}


def test_a_run_tests_at_each_length_into_metrics_json_and_the_png(trained):
    metrics = trained["metrics"]
    # no overlap: 1x windows are the test's own, so the same loss (float32 sums of the same terms)
    assert metrics["test/loss@1"] == pytest.approx(metrics["test/loss"], rel=1e-6)
    assert metrics["test/tokens@1"] == metrics["test/tokens"] == TEST_TOKENS
    assert metrics["test/tokens@2/bucket0"] + metrics["test/tokens@2/bucket1"] == TEST_TOKENS
    assert {"test/ppl@2", "test/loss@2/bucket0", "test/loss@2/bucket1"} <= set(metrics)
    assert not any("@4" in k for k in metrics)
    assert (trained["_dir"] / PNG_NAME).stat().st_size > 0
    # the summary: a row per length, the buckets as a grid (a row per length, a column per bucket)
    printed = trained["_stdout"]
    assert "test/loss@2 " in printed and "per bucket" in printed
    assert "test/loss@2/bucket1" not in printed.split("lm / unas / seed")[-1]


def test_eval_py_takes_eval_lengths_on_its_command_line(trained, tmp_path, data_dir):
    """A run's config.yaml is saved resolved (its datamodule holds the run's eval_lengths [1, 2]),
    and an older run's has no eval_lengths at all: the command line's task.eval_lengths must still
    reach the datamodule it feeds."""
    [best] = (trained["_dir"] / "checkpoints").glob("best-*.ckpt")
    old_run = tmp_path / "old_run"
    (old_run / "checkpoints").mkdir(parents=True)
    (old_run / "checkpoints" / best.name).write_bytes(best.read_bytes())
    config = OmegaConf.load(trained["_dir"] / "config.yaml")
    del config.task["eval_lengths"], config.task.datamodule["eval_lengths"]
    OmegaConf.save(config, old_run / "config.yaml")
    for run, lengths in ((trained["_dir"], [1, 4]), (old_run, [2])):
        out = tmp_path / f"eval_{run.name}"
        out.mkdir()
        run_here(["task=lm", f"ckpt_path={run / 'checkpoints' / best.name}",
                  f"task.eval_lengths=[{','.join(map(str, lengths))}]", *QUIET[:1]], out, data_dir,
                 script="eval.py")
        [path] = (out / "outputs").rglob("eval_metrics.json")
        metrics = json.loads(path.read_text())["metrics"]
        assert sorted({int(k.split("@")[1].split("/")[0]) for k in metrics if "@" in k}) == lengths
        assert all(metrics[f"test/tokens@{m}"] == TEST_TOKENS for m in lengths)
        assert (path.parent / PNG_NAME).is_file()
    assert metrics["test/loss@2"] == pytest.approx(trained["metrics"]["test/loss@2"], rel=1e-6)


@pytest.mark.slow
def test_two_processes_score_the_same_tokens_and_loss_as_one(trained, tmp_path, data_dir):
    """hardware=ddp_cpu: each process scores its own windows (EvaluationShards; at 2x the one
    window falls to rank 0 and rank 1 scores none), the sums over processes are one process's."""
    [best] = (trained["_dir"] / "checkpoints").glob("best-*.ckpt")
    run_cli(["task=lm", f"ckpt_path={best}", "hardware=ddp_cpu", *QUIET[:1]], tmp_path, data_dir,
            script="eval.py")
    [path] = (tmp_path / "outputs").rglob("eval_metrics.json")
    metrics = json.loads(path.read_text())["metrics"]
    for key, value in trained["metrics"].items():
        if "@" in key:
            assert metrics[key] == pytest.approx(value, rel=1e-6), key

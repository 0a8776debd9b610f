"""Task lm, model side: sliding-window perplexity against plain loops, the adaptive softmax,
generation with the KV cache against re-running the prefix, DDP evaluation shards, the CLI guard."""

import math

import pytest
import pytorch_lightning as pl
import torch
from helpers.cards import TINY
from helpers.cli import QUIET, metrics_files, run_cli, run_here
from helpers.modules import task_module
from helpers.paths import FIXTURES as FIXTURE_ROOT
from torch.utils.data import DataLoader, DistributedSampler

from attnlab.attention import KVCache, PrefixCache
from tasks.common.decoding import sample
from tasks.lm.datamodule import LMDataModule
from tasks.lm.embeddings import AdaptiveEmbedding
from tasks.lm.module import LMModule
from tasks.lm.windows import EvaluationShards, TokenWindows, collate_windows

V, BLOCK, EOS, PAD = 40, 8, 1, 0
LM = FIXTURE_ROOT / "lm"


def tiny_module(scheme: str = "unas", **kwargs) -> LMModule:
    torch.manual_seed(0)
    order = torch.randperm(V).tolist()  # adaptive bands over a shuffled vocabulary
    sizes = {"d_model": 16, "nhead": 2, "num_layers": 2, "dim_feedforward": 32, "dropout": 0.0}
    return task_module("lm", {"scheme": scheme}, vocab_size=V, pad_id=PAD, eos_id=EOS, block_size=BLOCK,
                       **{"adaptive_cutoffs": [5, 15], "token_order": order, **sizes, **kwargs}).eval()


def validate(module: LMModule, stream: torch.Tensor, stride: int) -> dict:
    loader = DataLoader(TokenWindows(stream.numpy(), EOS, BLOCK, stride), batch_size=3,
                        collate_fn=collate_windows(PAD))
    trainer = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu")
    return trainer.validate(module, dataloaders=loader, verbose=False)[0]


@torch.no_grad()
def plain_loss(module: LMModule, stream: torch.Tensor, context_start) -> float:
    """Mean -log p(s[t] | x[context_start(t) : t + 1]) token by token, x = [eos] + s."""
    x = torch.cat([torch.tensor([EOS]), stream])
    total = 0.0
    for t in range(len(stream)):
        inputs = x[context_start(t) : t + 1][None]
        log_probs = torch.log_softmax(module.net.logits(module.net(inputs)[0, -1]), -1)
        total -= float(log_probs[stream[t]])
    return total / len(stream)


@pytest.mark.parametrize("scheme", ["unas", "coda"])
def test_sliding_window_perplexity_equals_a_plain_loop_over_the_tokens(scheme):
    module = tiny_module(scheme)
    stream = torch.randint(2, V, (29,))
    # stride 1: every token after the first block sees exactly the block_size inputs before it
    result = validate(module, stream, stride=1)
    expected = plain_loss(module, stream, lambda t: max(0, t + 1 - BLOCK))
    assert result["val/tokens"] == len(stream)  # each token scored once
    assert result["val/loss"] == pytest.approx(expected, rel=1e-5)
    assert result["val/ppl"] == pytest.approx(math.exp(expected), rel=1e-5)
    assert result["val/bpt"] == pytest.approx(expected / math.log(2), rel=1e-5)
    # stride = block_size: contiguous blocks, a token sees its block's inputs; the last, partial
    # block (29 = 3 x 8 + 5) reaches back to a full window
    result = validate(module, stream, stride=BLOCK)
    assert result["val/tokens"] == len(stream)
    blocks = plain_loss(module, stream, lambda t: min(t - t % BLOCK, len(stream) - BLOCK))
    assert result["val/loss"] == pytest.approx(blocks, rel=1e-5)


def test_adaptive_softmax_is_a_distribution_and_its_nll_is_the_full_one():
    torch.manual_seed(0)
    order = torch.randperm(V)
    emb = AdaptiveEmbedding(V, 16, [5, 15], factor=2, token_order=order.tolist())
    hidden, targets = torch.randn(7, 16), torch.randint(0, V, (7,))
    log_probs = emb.logits(hidden)
    torch.testing.assert_close(log_probs.logsumexp(-1), torch.zeros(7), atol=1e-5, rtol=0)
    torch.testing.assert_close(emb.nll(hidden, targets), -log_probs.gather(1, targets[:, None]).squeeze(1))
    # the most frequent tokens (order[:5]) are the head's words: 16 wide; the rarest 4 wide
    assert emb(order[:1]).shape == (1, 16)
    assert emb.embeddings[0].weight.shape == (5, 16) and emb.embeddings[2].weight.shape == (V - 15, 4)
    # the output uses the input's weights (tied): one target per band trains every band's embeddings
    emb.nll(hidden[:3], order[[0, 7, 30]]).sum().backward()
    assert all(p.grad is not None for p in emb.embeddings.parameters())


@torch.no_grad()
def test_generation_with_the_cache_equals_generation_by_rerunning_the_prefix():
    module = tiny_module("unas")
    model = module.net
    prompts = torch.randint(2, V, (3, 4))
    # one step with cached keys/values equals the full pass over the prefix
    cache = model.start_decoding()
    assert isinstance(cache, KVCache)
    for t in range(prompts.shape[1]):
        step = model.decode_step(prompts[:, t], cache)
        torch.testing.assert_close(step, model(prompts[:, : t + 1])[:, -1], atol=1e-5, rtol=1e-5)
    # greedy: the cache, the prefix re-run, and a plain argmax loop over full passes agree
    greedy = sample(model, prompts, max_new_tokens=5)
    assert torch.equal(greedy, sample(model, prompts, max_new_tokens=5, cache=model.start_decoding(cached=False)))
    sequence = prompts
    for _ in range(5):
        sequence = torch.cat([sequence, model.logits(model(sequence)[:, -1]).argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(greedy, sequence[:, 4:])
    # top-k: the same draws from the same seed, whichever decoding
    kwargs = {"max_new_tokens": 5, "top_k": 4}
    cached = sample(model, prompts, generator=torch.Generator().manual_seed(3), **kwargs)
    rerun = sample(model, prompts, generator=torch.Generator().manual_seed(3), cache=PrefixCache(), **kwargs)
    assert torch.equal(cached, rerun) and not torch.equal(cached, greedy)


@pytest.mark.parametrize("scheme", ["coda", "realformer"])
@torch.no_grad()
def test_cascades_decode_row_by_row_with_the_cache(scheme):
    """CODA's and RealFormer's logits of the newest query depend on the same row of the layer
    before: a step carries that row and equals the full pass over the prefix."""
    model = tiny_module(scheme).net
    prompts = torch.randint(2, V, (2, 5))
    cache = model.start_decoding()
    assert isinstance(cache, KVCache)
    for t in range(prompts.shape[1]):
        step = model.decode_step(prompts[:, t], cache)
        torch.testing.assert_close(step, model(prompts[:, : t + 1])[:, -1], atol=1e-5, rtol=1e-5)
    greedy = sample(model, prompts, max_new_tokens=4)
    assert torch.equal(greedy, sample(model, prompts, max_new_tokens=4, cache=PrefixCache()))


def test_evaluation_shards_score_every_window_once():
    dataset = TokenWindows(torch.arange(2, 40).numpy(), EOS, BLOCK, 3)  # 11 windows
    shards = [EvaluationShards(dataset, 3, rank) for rank in range(3)]
    indices = [i for shard in shards for i in shard]
    assert sorted(indices) == list(range(len(dataset))) == sorted(set(indices))
    assert [len(s) for s in shards] == [4, 4, 3]
    assert isinstance(shards[0], DistributedSampler)  # so Lightning does not swap in its own (padded) one


def test_prompts_are_beginnings_of_test_segments():
    dm = LMDataModule(source="wikitext", data_dir=str(LM / "wikitext"), debian_dir="unused",
                      block_size=8, eval_stride=None, eval_batch_size=None, seed=42, cache_dir=None)
    dm.prepare_data()
    dm.setup("fit")
    prompts = dm.prompts("test", count=2, length=3)
    assert prompts.shape == (2, 4) and (prompts[:, 0] == dm.eos_id).all()
    lines = [line.split() for line in (LM / "wikitext" / "wiki.test.tokens").read_text().splitlines()]
    starts = [dm.tokenizer.encode(" ".join(words[:3])).ids for words in lines if len(words) >= 3]
    assert prompts[:, 1:].tolist() == [starts[0], starts[-1]]  # the first and the last such segment


def test_a_checkpoint_reloads_the_token_order_and_scores_the_same(tmp_path):
    module = tiny_module("unas")
    stream = torch.randint(2, V, (20,))
    before = validate(module, stream, stride=4)["val/loss"]
    path = tmp_path / "lm.ckpt"
    torch.save({"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams),
                "pytorch-lightning_version": pl.__version__}, path)
    reloaded = tiny_module("unas", token_order=None)  # as eval.py builds it, then the checkpoint's state
    reloaded.load_state_dict(torch.load(path, weights_only=False)["state_dict"])
    assert torch.equal(reloaded.net.embed.rank, module.net.embed.rank)  # not the identity of a fresh model
    assert validate(reloaded, stream, stride=4)["val/loss"] == pytest.approx(before, rel=1e-6)


def test_query_normalized_schemes_are_refused_at_once(tmp_path, data_dir):
    proc = run_here(["task=lm", "model=dnas", *TINY["lm"], *QUIET], tmp_path, data_dir, check=False)
    assert proc.returncode == 2, proc.stderr
    message = " ".join(proc.stderr.split())  # rich wraps long lines
    assert "model=dnas normalizes over queries" in message and "model=unas" in message
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not list((tmp_path / "outputs").rglob("*.ckpt"))


@pytest.mark.slow
def test_ddp_scores_every_test_token_once(tmp_path, data_dir):
    """Two CPU processes: the 27 test tokens of the fixture (3 windows, 2 + 1 per process) are
    scored once each; Lightning's padded DistributedSampler would score a repeated window too."""
    run_cli(["task=lm", "model=unas", "hardware=ddp_cpu", *TINY["lm"], *QUIET, "~callbacks.head_importance"],
            tmp_path, data_dir)
    [record] = [r for r in metrics_files(tmp_path / "outputs") if r["status"] == "ok"]
    assert record["metrics"]["test/tokens"] == 27 and record["metrics"]["val/tokens"] == 30

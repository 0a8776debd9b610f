"""`LMModule`: causal language modelling with a decoder-only Transformer (`tasks.lm.model`) whose
self-attention uses the `model=` scheme in every layer (CODA Table 1; Repulsive attention).

- train: mean cross entropy of the next token over each training block.
- val / test: over the scored targets of the sliding windows only (`score_mask`: each token of
  the split exactly once, with at least `block_size - eval_stride` tokens of context), summed
  over the split and divided once: `{stage}/loss` (nats per token), `{stage}/ppl` = exp(loss),
  `{stage}/bpt` (bits per token) and `{stage}/tokens` (how many were scored). With a word-level
  vocabulary (Wikitext, PTB, plain text) a token is a word, so ppl is the word-level perplexity
  the papers report; with the Debian default's WordPiece it is per word piece.
- `forward(batch)` returns the scored tokens' (logits (N, V), labels (N,)), which the Calibration
  callback reads (ECE over next-token predictions).
- end of test, with `task.eval_lengths` (the datamodule's `eval_lengths`): the test split again in
  windows of m x block_size tokens for each multiple m, loss per length and per position bucket
  (`tasks.lm.lengths`) -> metrics and `length_generalization.png`. A model whose positions cannot
  reach the longest window is refused when the run starts (`setup`), before it trains or tests.
- end of test: greedy and top-k continuations of a few test prompts, with the KV-cached decoding
  of `tasks.common.decoding.sample` (cached keys/values; cascades carried row by row), into `predictions.txt`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric

from attnlab.attention import cacheable
from attnlab.callbacks.after_test import analysis_progress
from attnlab.loggers import LoggerAdapter
from attnlab.task_module import TaskModule
from tasks.common.decoding import sample
from tasks.lm.lengths import PNG_NAME, LengthCurves
from tasks.lm.model import TransformerLM


class TokenNLL(Metric):
    """Sum of -log p over scored tokens and their number (summed over DDP processes)."""

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("nll", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("tokens", torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, nll: Tensor) -> None:
        self.nll += nll.detach().double().sum()
        self.tokens += nll.numel()

    def compute(self) -> tuple[float, int]:
        """(mean -log p, number of tokens) of everything seen (on every process)."""
        return float(self.nll / self.tokens.clamp(min=1)), int(self.tokens)


class LMModule(TaskModule):
    """The decoder-only Transformer (`tasks.lm.model.TransformerLM`, task.module.net), the optimizer
    (AdamW, or fairseq's NAG) and the schedule (linear or cosine) come injected; the module's own
    options are the end-of-test samples'."""

    def __init__(
        self,
        net: TransformerLM,
        optimizer: Callable[..., Any],
        scheduler: Callable | None,
        *,
        sample_prompts: int = 4,
        prompt_length: int = 16,
        sample_length: int = 32,
        top_k: int = 10,
        temperature: float = 1.0,
        sample_seed: int,  # the run's seed (conf/task/lm.yaml)
        predictions_file: str = "predictions.txt",
    ) -> None:
        super().__init__(net, optimizer, scheduler)
        self.val_nll = TokenNLL()
        self.test_nll = TokenNLL()
        # the unigram model's -log p on the same tokens (the card's trivial baseline, baseline_ppl)
        self.val_unigram = TokenNLL()
        self.test_unigram = TokenNLL()
        self._unigram_nll: Tensor | None = None

    def setup(self, stage: str) -> None:
        super().setup(stage)
        datamodule = getattr(self.trainer, "datamodule", None)
        lengths = getattr(datamodule, "eval_lengths", None)
        if lengths and stage in ("fit", "test"):
            # before any training or test work: a learned table too small for the longest window
            asked = "task.eval_lengths=[" + ",".join(str(m) for m in lengths) + "]"
            self.net.check_length(max(lengths) * datamodule.block_size, asked)

    # -- steps -------------------------------------------------------------------------------

    def forward(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """Logits (N, V) and labels (N,) of the N scored targets of the batch."""
        hidden = self.net(batch["input_ids"], batch["padding_mask"])
        scored = batch["score_mask"]
        return self.net.logits(hidden[scored]), batch["target_ids"][scored]

    def task_loss(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        hidden = self.net(batch["input_ids"], batch["padding_mask"])
        scored = batch["score_mask"]
        # nll without materializing full logits where the output layer allows (adaptive softmax)
        nll = self.net.nll(hidden[scored], batch["target_ids"][scored])
        loss = nll.mean()
        self.log("train/loss", loss, prog_bar=True, batch_size=nll.numel())
        return loss

    def unigram_nll(self, vocab_size: int) -> Tensor | None:
        """-log p of every token under the training split's unigram counts (add-one smoothed);
        None without the datamodule's training stream (an evaluation from a checkpoint alone)."""
        if self._unigram_nll is None:
            streams = getattr(getattr(self.trainer, "datamodule", None), "streams", None) or {}
            if "train" not in streams:
                return None
            counts = torch.bincount(torch.as_tensor(streams["train"], dtype=torch.long),
                                    minlength=vocab_size).double() + 1
            self._unigram_nll = (counts.sum().log() - counts.log()).to(self.device)
        return self._unigram_nll

    def _evaluate(self, batch: dict[str, Tensor], metric: TokenNLL, unigram: TokenNLL) -> None:
        logits, labels = self(batch)
        metric.update(torch.nn.functional.cross_entropy(logits.float(), labels, reduction="none"))
        table = self.unigram_nll(logits.shape[-1])
        if table is not None:
            unigram.update(table[labels])

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._evaluate(batch, self.val_nll, self.val_unigram)

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._evaluate(batch, self.test_nll, self.test_unigram)

    def _log_split(self, stage: str, metric: TokenNLL) -> None:
        loss, tokens = metric.compute()  # synced over processes by torchmetrics
        metric.reset()
        unigram = getattr(self, f"{stage}_unigram")
        if unigram.update_called:
            baseline, counted = unigram.compute()
            if counted:
                self.log(f"{stage}/baseline_ppl", math.exp(min(baseline, 700.0)))
        unigram.reset()
        if tokens == 0:
            return
        self.log(f"{stage}/loss", loss)
        self.log(f"{stage}/ppl", math.exp(min(loss, 700.0)), prog_bar=stage == "val")
        self.log(f"{stage}/bpt", loss / math.log(2))
        self.log(f"{stage}/tokens", float(tokens))

    def on_validation_epoch_end(self) -> None:
        self._log_split("val", self.val_nll)

    def on_test_epoch_end(self) -> None:
        self._log_split("test", self.test_nll)
        datamodule = getattr(self.trainer, "datamodule", None)
        if getattr(datamodule, "eval_lengths", None):
            self.evaluate_lengths(datamodule)
        if self.hparams.sample_prompts > 0 and self.trainer.is_global_zero:
            self.write_samples()

    # -- lengths never trained at ----------------------------------------------------------------

    @torch.no_grad()
    def evaluate_lengths(self, datamodule) -> LengthCurves:
        """Score the test split at each of `datamodule.eval_lengths` (multiples of the training
        block), as the test step scores a window (float32 log-probabilities under the run's
        precision); log the metrics of `tasks.lm.lengths`, write the PNG (rank 0)."""
        lengths, block = datamodule.eval_lengths, datamodule.block_size
        curves = LengthCurves(lengths, block, self.device)
        loaders = [(m, datamodule.length_loader(m)) for m in lengths]
        # the bar names the length being scored: after a length's last batch, the next one's
        bars = [f"test at {m}x ({m * block} tokens)" for m in lengths] + ["test at every length"]
        with analysis_progress(self.trainer, bars[0], sum(len(loader) for _, loader in loaders)) as advance:
            for i, (m, loader) in enumerate(loaders):
                for k, batch in enumerate(loader):
                    batch = {name: tensor.to(self.device) for name, tensor in batch.items()}
                    with self.trainer.precision_plugin.test_step_context():
                        hidden = self.net(batch["input_ids"], batch["padding_mask"])
                        scored = batch["score_mask"]
                        # float32 -log p without the (N, V) logits where the output layer
                        # allows (the adaptive softmax: most of a long window's cost otherwise)
                        nll = self.net.nll(hidden[scored], batch["target_ids"][scored]).float()
                    # windows start at column 0 of their rows: a token's column is its position
                    curves.update(m, nll, batch["score_mask"].nonzero()[:, 1])
                    advance(bars[i + 1] if k == len(loader) - 1 else bars[i])
        curves.reduce(lambda t: self.trainer.strategy.reduce(t, reduce_op="sum"))
        metrics = curves.metrics("test")
        for name, value in metrics.items():
            self.log(name, value)
        if self.trainer.is_global_zero:
            path = curves.write_png(Path(self.trainer.default_root_dir) / PNG_NAME)
            LoggerAdapter(self.trainer).image("test/length_generalization", path)
            losses = ", ".join(f"{m}x {metrics[f'test/loss@{m}']:.4f}" for m in lengths)
            print(f"[lm] test loss by window length (trained at {block} tokens): {losses} -> {path}", flush=True)
        return curves

    # -- samples -----------------------------------------------------------------------------

    def write_samples(self) -> Path | None:
        """Greedy and top-k continuations of test prompts -> predictions.txt in the run dir."""
        hp = self.hparams
        datamodule = getattr(self.trainer, "datamodule", None)
        if datamodule is None or not hasattr(datamodule, "prompts"):
            print("[lm] no datamodule with prompts: samples skipped")
            return None
        # prompt + new tokens within the model's positions: at least one prompt token, then as many
        # new tokens as fit (a block_size <= sample_length would otherwise fail the end of test)
        new = min(hp.sample_length, self.net.max_positions - 1)
        length = max(1, min(hp.prompt_length, self.net.max_positions - new))
        prompts = datamodule.prompts("test", hp.sample_prompts, length).to(self.device)
        if prompts.numel() == 0:
            return None
        greedy = sample(self.net, prompts, max_new_tokens=new)
        generator = torch.Generator(device=self.device).manual_seed(int(hp.sample_seed))
        top_k = sample(self.net, prompts, max_new_tokens=new, top_k=hp.top_k,
                       temperature=hp.temperature, generator=generator)
        decoding = "KV cache" if cacheable(self.net.layers, cascades=True) else "prefix re-run (this transform cannot be cached)"
        header = (f"# {len(prompts)} test prompts of {prompts.shape[1] - 1} tokens, {new} new tokens "
                  f"each; greedy and top-{hp.top_k} (temperature {hp.temperature}, seed {hp.sample_seed}); "
                  f"decoding: {decoding}")
        blocks = [header]

        def text(ids: list[int]) -> str:  # one line per sample: segment ends shown as <eos>
            return datamodule.decode(ids).replace("\n", " <eos> ")

        for p, g, k in zip(prompts.tolist(), greedy.tolist(), top_k.tolist()):
            blocks.append(f"prompt: {text(p[1:])}\ngreedy: {text(g)}\ntop-{hp.top_k}: {text(k)}")
        path = Path(self.trainer.default_root_dir) / hp.predictions_file
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n\n".join(blocks) + "\n", encoding="utf-8")
        print(f"[lm] wrote {len(prompts)} greedy / top-{hp.top_k} samples to {path}\n{blocks[1]}", flush=True)
        return path

"""Claim: explaining away in a pretrained Transformer (DNAS paper, Sec. 3: epsilon-explained-away).

classify's own claim for `python -m attnlab.reproduce` (its card lists this module in
`task.card.reproduce.claims`; attnlab.study.reproduce.registry imports it by name). The paper's
argument starts from UNAS (softmax over keys) leaving keys with a column sum below 1e-8 -- no
query attends to them -- and DNAS's lemma keeping every column sum >= 1/S. Here it is measured on
real weights: the packaged 6-layer BERT (MiniLM-L6, bert-base-uncased vocabulary) on real text
(Debian package descriptions of mlm's test split, 128 tokens each), per layer and head:

- under the model's own softmax (UNAS through attnlab.hf, equal to HF's attention), as pretrained;
- after fine-tuning on classify (`task.encoder=pretrained`) with UNAS and with HNAS, each under
  its own scheme (HNAS: u * DNAS + (1 - u) * UNAS, u trained per layer and head).

Numbers: the share of keys whose column sum is below 1e-8 and 1e-3, the minimum column sum x S
(>= 1 is the DNAS lemma's bound, u for HNAS), HNAS's u, and the histograms of log10 column sums
(`pretrained_explaining_away.png`; every (layer, head) in `pretrained_explaining_away.csv`).
Verdict (`judge`): *not tested* when the pretrained UNAS model has no key below 1e-8 (the paper's
premise absent on real weights: the mechanism never engages); otherwise *holds* when the
fine-tuned HNAS model has fewer such keys than the fine-tuned UNAS one, *contradicted* when not.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf
from rich.progress import Progress

from attnlab import checkpoints
from attnlab.attention import AttentionSpec
from attnlab.study.evidence import CONTRADICTED, HOLDS, NOT_TESTED, ClaimResult, Run, not_tested
from tasks.classify.pretrained import load_pretrained_bert
from tasks.classify.pretrained_stats import (
    THRESHOLDS,
    HeadColumns,
    column_statistics,
    hybrid_u,
    texts_as_batches,
)
from tasks.common import debian

NAME = "pretrained_explaining_away"
TITLE = "Explaining away in a pretrained Transformer"
PAPER = "DNAS paper, Sec. 3 (epsilon-explained-away, the DNAS lemma)"
CLAIM = ("softmax attention (UNAS) explains keys away: some keys get a column sum below 1e-8 from "
         "all queries; doubly-normalized attention keeps every column sum >= 1/S")

MODELS = ("unas", "hnas")
# the fine-tuning runs: the packaged BERT under classify's hops, short inputs (CPU)
FINE_TUNE = ("task.encoder=pretrained", "task.data.max_length=32", "task.data.max_train_examples=2000",
             "task.data.max_eval_examples=500")
QUICK = ("++trainer.limit_train_batches=20", "++trainer.limit_val_batches=4", "++trainer.limit_test_batches=4")
TEXTS = {"quick": 64, "full": 512, "gpu": 512}


def _extra(plan) -> tuple[str, ...]:
    return FINE_TUNE + (QUICK if plan.mode == "quick" else ())


def runs(plan) -> list[Run]:
    return [plan.run("classify", model, seed, _extra(plan)) for model in MODELS for seed in plan.seeds]


def real_texts(root: Path) -> list[str]:
    """Debian descriptions of mlm's test split (fetched with apt-get on first use, as mlm does)."""
    folder = root / "data" / "debian"
    debian.prepare(folder)
    return debian.unique_paragraphs(debian.load_rows(folder))["test"]


def fine_tuned_bert(run_dir: Path) -> torch.nn.Module:
    """The BERT of a classify run with encoder=pretrained, from its best (else last) checkpoint,
    with the run's scheme."""
    config = OmegaConf.load(run_dir / "config.yaml")
    ckpts = sorted((run_dir / "checkpoints").glob("*.ckpt"), key=lambda p: (not p.name.startswith("best"), p.name))
    if not ckpts:
        raise FileNotFoundError(f"{run_dir}/checkpoints has no checkpoint")
    layers = OmegaConf.select(config, "task.module.net.pretrained_layers")
    bert = load_pretrained_bert(AttentionSpec.from_config(config.model), layers)
    state = checkpoints.read(ckpts[0])["state_dict"]  # weights only: data, not code
    prefix = "net.encoder.bert."
    bert.load_state_dict({k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)})
    return bert


def measure(models: dict[str, torch.nn.Module], batches: list) -> dict[str, list[HeadColumns]]:
    with Progress() as progress:
        task = progress.add_task("column sums of the pretrained BERT", total=len(models) * len(batches))
        return {name: column_statistics(bert, batches, lambda: progress.advance(task))
                for name, bert in models.items()}


def _layer_rows(name: str, layers: list[HeadColumns], us: list[np.ndarray]) -> list[str]:
    rows = []
    for index, stats in enumerate(layers):
        low, high = (stats.share(t) for t in THRESHOLDS)
        worst = int(np.argmin(stats.min_x_s))
        u = f"{us[index].mean():.3f} ({us[index].min():.3f}-{us[index].max():.3f})" if us else "—"
        rows.append(f"| {name} | {index} | {int(stats.below[1e-8].sum())} ({low.mean():.3%}) | "
                    f"{int(stats.below[1e-3].sum())} ({high.mean():.3%}; head {int(np.argmax(high))}: "
                    f"{high.max():.3%}) | {stats.min_x_s.min():.3g} (head {worst}) | {u} |")
    return rows


def write_csv(path: Path, measured: dict[str, list[HeadColumns]]) -> None:
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["model", "layer", "head", "keys", "share_below_1e-8", "share_below_1e-3", "min_col_sum_x_S"])
        for name, layers in measured.items():
            for index, stats in enumerate(layers):
                for head in range(stats.heads):
                    out.writerow([name, index, head, int(stats.counts[head]), stats.share(1e-8)[head],
                                  stats.share(1e-3)[head], stats.min_x_s[head]])


def plot(path: Path, measured: dict[str, list[HeadColumns]]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(measured), figsize=(4 * len(measured), 3), squeeze=False,
                             constrained_layout=True)
    bins = np.linspace(-12, 2, 57)
    for ax, (name, layers) in zip(axes[0], measured.items()):
        for index, stats in enumerate(layers):
            ax.hist(stats.log_sums(), bins=bins, histtype="step", density=True, label=f"layer {index}")
        for t in THRESHOLDS:
            ax.axvline(np.log10(t), color="k", ls="--", lw=0.8)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("log10 column sum (S = 128)")
    axes[0][0].legend(fontsize=7)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def judge(premise: bool, tuned: bool, fewer: bool) -> tuple[str, str]:
    """(verdict, reason): the premise (a pretrained softmax key below 1e-8) is the mechanism;
    without it nothing is tested; with it, HNAS fine-tuning leaves fewer such keys (holds) or not."""
    if not premise:
        return NOT_TESTED, ("mechanism not engaged: no column sum of the pretrained softmax model "
                            "is below 1e-8 (the paper's premise is absent on these weights)")
    if not tuned:
        return NOT_TESTED, "not run: the fine-tuned UNAS and HNAS models are missing"
    return (HOLDS, "") if fewer else (CONTRADICTED, "")


def evaluate(plan, results, out_dir) -> ClaimResult:
    out_dir = Path(out_dir)
    try:
        texts = real_texts(plan.root)
    except (OSError, ValueError) as err:  # DataError is a ValueError; no data and no apt-get
        return not_tested(NAME, TITLE, PAPER, CLAIM, f"not run: no Debian descriptions: {err}")
    batches = texts_as_batches(texts, TEXTS[plan.mode])
    if not batches:
        return not_tested(NAME, TITLE, PAPER, CLAIM, "not run: no Debian description fills 128 tokens")
    models = {"pretrained (softmax)": load_pretrained_bert("unas")}
    notes = []
    for model in MODELS:
        run = plan.run("classify", model, plan.seeds[0], _extra(plan))
        record = results.get(run)
        if plan.skip_reason("classify"):
            notes.append(f"fine-tuned {model.upper()}: not run ({plan.skip_reason('classify')})")
        elif record is None:
            notes.append(f"fine-tuned {model.upper()}: {results.error(run)}")
        else:
            models[f"fine-tuned {model.upper()}"] = fine_tuned_bert(Path(record["run_dir"]))
    measured = measure(models, batches)
    us = {name: hybrid_u(bert) for name, bert in models.items()}
    write_csv(out_dir / f"{NAME}.csv", measured)
    figure = plot(out_dir / f"{NAME}.png", measured)
    table = [("| model | layer | keys below 1e-8 (share) | keys below 1e-3 (share; worst head) | "
              "min col sum x S (head) | HNAS u mean (range) |"), "|---|---|---|---|---|---|"]
    for name, layers in measured.items():
        table += _layer_rows(name, layers, us[name])
    below = {name: sum(int(s.below[1e-8].sum()) for s in layers) for name, layers in measured.items()}
    below3 = {name: float(np.mean([s.share(1e-3).mean() for s in layers])) for name, layers in measured.items()}
    premise = below["pretrained (softmax)"] > 0
    tuned = {"fine-tuned UNAS", "fine-tuned HNAS"} <= set(below)
    verdict, reason = judge(premise, tuned, tuned and below["fine-tuned HNAS"] < below["fine-tuned UNAS"])
    keys = sum(int(s.counts.sum()) for s in measured["pretrained (softmax)"])
    ours = "; ".join(f"{name}: {below[name]} of {keys} (layer, head, key) column sums below 1e-8, "
                     f"{below3[name]:.3%} below 1e-3" for name in measured)
    return ClaimResult(
        name=NAME, title=TITLE, source=PAPER, paper=CLAIM, ours=ours + (". " + "; ".join(notes) if notes else ""),
        setting=(f"{sum(len(b[0]) for b in batches)} Debian descriptions x 128 tokens; "
                 f"fine-tuning: {plan.setting_text('classify')} {' '.join(_extra(plan))}"),
        seeds=str(plan.seeds[0]), verdict=verdict, reason=reason,
        details="\n".join([*table, "", *[f"- {n}" for n in notes]]), figures=[figure.name],
    )

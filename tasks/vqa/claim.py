"""Claim: multi-view VQA (DNAS paper, Table 1 and Fig. 3): fusing detector views with DNAS/HNAS.

VQA's own claim for `python -m attnlab.reproduce`: the task's card lists this module
(`task.card.reproduce.claims: [..., tasks.vqa.claim, ...]`) and attnlab.study.reproduce.registry imports
it by that name, so the library never imports the task.

UNAS, DNAS and HNAS fusions against the primary-view-only and concatenation baselines, over the
claim's seeds, on two synthetic benchmarks:

- default: UNAS does not explain away the boxes that only a secondary view has (their column sum
  is ~1 under UNAS: the primary boxes near them have no better match), so DNAS has nothing to fix;
- mirror (`task.synthetic.mirror_primary=true task.synthetic.feature_scale=3`): every secondary
  detector also finds what the primary one finds, so each primary box has a near-duplicate in every
  secondary view and the secondary-only boxes are nobody's best match; features of a detector's
  size (x3, scores x9) make the fusion's matching sharp. A UNAS fusion then explains those boxes
  away, which the column sums per kind of box show.

Column sums are shown twice: of the fusion as it starts (query/key projections at the identity,
`fusion_init=similarity`: what the data impose; the first 100 test images, computed here with the
library's attention) and of the trained fusion over the test set (the task's `test/col_sum_*`,
means over the fusion layers, one per secondary view). Accuracy: test overall and on the questions
whose answer needs an object the primary view misses (`acc_hidden`).

Verdict, from the benchmarks where UNAS explains the secondary-only boxes away at the start (their
median column sum below 0.1 and below DNAS's; elsewhere the mechanism never engages): DNAS and HNAS
against UNAS on `acc_hidden`, paired by seed (attnlab.study.stats.contrast_family, Holm over the
contrasts, equivalence margin MARGIN): *holds* when one of them is better, *contradicted* when
both are worse or equivalent, *not tested* otherwise (underpowered: the intervals; with one seed
no test is possible). The accuracy ordering is reported as it comes out.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from attnlab.attention import attention_weights
from attnlab.study import stats as study_stats
from attnlab.study.evidence import CONTRADICTED, HOLDS, NOT_TESTED, ClaimResult, Run, not_tested
from tasks.vqa import datamodule as vqa_data
from tasks.vqa import synthetic

NAME = "multiview_vqa"
TITLE = "Multi-view VQA"
PAPER = "DNAS paper, Table 1 and Fig. 3"
CLAIM = ("fusing the secondary views with DNAS/HNAS attention does better than with UNAS, which "
         "explains away secondary-view boxes (Fig. 3); baselines: primary view only, concatenation")

BENCHMARKS = {
    "default": (),
    "mirror": ("task.synthetic.mirror_primary=true", "task.synthetic.feature_scale=3"),
}
# name -> (model, extra overrides)
CONFIGS = {
    "UNAS": ("unas", ()),
    "DNAS": ("dnas", ()),
    "HNAS": ("hnas", ()),
    "primary": ("unas", ("task.fusion=primary",)),
    "concat": ("unas", ("task.fusion=concat",)),
}
FUSION_LAYERS = 2  # one per secondary view
BOX_KINDS = ("hidden", "visible", "background")


def _runs_of(plan, benchmark: str, config: str) -> list[Run]:
    model, extra = CONFIGS[config]
    return [plan.run("vqa", model, seed, BENCHMARKS[benchmark] + extra) for seed in plan.seeds]


def runs(plan) -> list[Run]:
    return [r for b in BENCHMARKS for c in CONFIGS for r in _runs_of(plan, b, c)]


def mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and standard error over the seeds that finished (NaN, NaN if none)."""
    values = [v for v in values if not math.isnan(v)]
    return study_stats.mean_se(values) if values else (math.nan, math.nan)


def _cell(stat: tuple[float, float]) -> str:
    mean, se = stat
    if math.isnan(mean):
        return "—"
    return f"{mean:.3f}" if math.isnan(se) else f"{mean:.3f} ± {se:.3f}"


def _layer_mean(results, run: Run, name: str) -> float:
    values = [results.metric(run, f"test/{name}_l{l}") for l in range(FUSION_LAYERS)]
    values = [v for v in values if not math.isnan(v)]
    return sum(values) / len(values) if values else math.nan


def initial_column_sums(record: dict, n_images: int = 100) -> dict[str, dict[str, np.ndarray]]:
    """Column sums of the identity-initialized fusion on a run's test data: {scheme: {box kind:
    column sums of every box of that kind in the secondary views}}."""
    config = OmegaConf.load(Path(record["run_dir"]) / "config.yaml")
    params = vqa_data.synthetic_params(OmegaConf.to_container(config.task.synthetic), config.task.max_boxes)
    data = synthetic.load(synthetic.prepare(config.task.data_dir, params))
    kinds = synthetic.box_kinds(data, "test")
    coords = bool(config.task.datamodule.box_coords)
    out = {scheme: {k: [] for k in synthetic.BOX_KINDS} for scheme in ("unas", "dnas")}
    for i in range(min(n_images, len(kinds))):
        n = data["test_num_boxes"][i]
        boxes = [torch.from_numpy(_box_features(data, i, v, n[v], coords)) for v in range(len(n))]
        for view in range(1, len(n)):
            for scheme in out:
                columns = attention_weights(boxes[0][None, None], boxes[view][None, None], scheme=scheme)[0, 0].sum(0)
                for k, kind in enumerate(synthetic.BOX_KINDS):
                    out[scheme][kind].append(columns[torch.from_numpy(kinds[i, view, : n[view]] == k)].numpy())
    return {s: {k: np.concatenate(v) if v else np.zeros(0) for k, v in per.items()} for s, per in out.items()}


def _box_features(data: dict, image: int, view: int, count: int, coords: bool) -> np.ndarray:
    """What the fusion sees of a box: its features and, with box_coords, its normalized box."""
    features = data["test_features"][image, view, :count].astype(np.float32)
    if coords:
        features = np.concatenate([features, data["test_bbox"][image, view, :count].astype(np.float32)], axis=1)
    return features


def plot_initial(sums: dict[str, dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(sums), 2, figsize=(8, 2.6 * len(sums)), squeeze=False, constrained_layout=True)
    bins = np.linspace(-12, 2, 57)
    for row, (benchmark, per_scheme) in zip(axes, sums.items()):
        for ax, (scheme, per_kind) in zip(row, per_scheme.items()):
            for kind, color in zip(BOX_KINDS, ("tab:red", "tab:blue", "tab:gray")):
                values = np.log10(np.clip(per_kind[kind], 1e-12, None))
                ax.hist(values, bins=bins, histtype="step", color=color, density=True, label=kind)
            ax.axvline(-8, color="k", ls="--", lw=0.8)
            ax.set_title(f"{benchmark}: {scheme.upper()} at the start", fontsize=9)
            ax.set_xlabel("log10 column sum (secondary boxes)")
        row[0].legend(fontsize=7, title="box shows", title_fontsize=7)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


MARGIN = 0.02  # acc_hidden: the equivalence margin of DNAS/HNAS against UNAS


def hidden_contrasts(plan, results, benchmark: str) -> dict[str, study_stats.Contrast]:
    """DNAS and HNAS against UNAS on acc_hidden, paired by seed, Holm over the two."""
    def by_seed(config: str) -> dict[int, float]:
        return {r.seed: results.metric(r, "test/acc_hidden") for r in _runs_of(plan, benchmark, config)}
    cells = {c: (by_seed(c), by_seed("UNAS"), MARGIN) for c in ("DNAS", "HNAS")}
    return study_stats.contrast_family(cells)


def judge(engaged: dict[str, dict[str, study_stats.Contrast]]) -> tuple[str, str]:
    """(verdict, reason) from the contrasts of the benchmarks where the mechanism engaged."""
    if not engaged:
        return NOT_TESTED, ("mechanism not engaged: on no benchmark does UNAS explain the "
                            "secondary-only boxes away at the start")
    verdicts = [c.verdict for contrasts in engaged.values() for c in contrasts.values()]
    if study_stats.BETTER in verdicts:
        return HOLDS, ""
    if verdicts and all(v in (study_stats.WORSE, study_stats.EQUIVALENT) for v in verdicts):
        return CONTRADICTED, ""
    parts = [f"{b}/{name} {c.difference:+.3f} " + (
             f"[{c.difference_interval[0]:+.3f}, {c.difference_interval[1]:+.3f}] ({c.n} seeds)"
             if c.n > 1 else f"({c.n} seed: no interval, no test)")
             for b, contrasts in engaged.items() for name, c in contrasts.items()]
    return NOT_TESTED, "underpowered: acc_hidden against UNAS " + "; ".join(parts)


def evaluate(plan, results, out_dir) -> ClaimResult:
    if plan.skip_reason("vqa"):
        return not_tested(NAME, TITLE, PAPER, CLAIM, f"vqa: not run ({plan.skip_reason('vqa')})")
    trained = [("| benchmark | fusion | test acc | acc hidden | acc visible | col sum hidden | col sum visible | "
               "col sum background | hidden below 1e-8 |"), "|" + "---|" * 9]
    start = ["| benchmark | scheme | median col sum hidden | visible | background | hidden below 1e-8 |",
             "|---|---|---|---|---|---|"]
    summary, failures, initial, engaged = [], [], {}, {}
    for benchmark in BENCHMARKS:
        stats = {}
        for config in CONFIGS:
            rs = _runs_of(plan, benchmark, config)
            failures += [f"{benchmark}/{config}/seed {r.seed}: {results.error(r)}" for r in rs if results.get(r) is None]
            stats[config] = {
                "acc": mean_se([results.metric(r, "test/acc") for r in rs]),
                "hidden": mean_se([results.metric(r, "test/acc_hidden") for r in rs]),
                "visible": mean_se([results.metric(r, "test/acc_visible") for r in rs]),
                **{f"col_{k}": mean_se([_layer_mean(results, r, f"col_sum_{k}") for r in rs]) for k in BOX_KINDS},
                "below": mean_se([_layer_mean(results, r, "explained_away_hidden") for r in rs]),
            }
            s = stats[config]
            trained.append(f"| {benchmark} | {config} | {_cell(s['acc'])} | {_cell(s['hidden'])} | {_cell(s['visible'])} | "
                           + " | ".join(_cell(s[f"col_{k}"]) for k in BOX_KINDS) + f" | {_cell(s['below'])} |")
        order = sorted((c for c in CONFIGS if not math.isnan(stats[c]["acc"][0])), key=lambda c: -stats[c]["acc"][0])
        record = next((results.get(r) for r in _runs_of(plan, benchmark, "UNAS") if results.get(r)), None)
        if not order or record is None:
            continue
        initial[benchmark] = sums = initial_column_sums(record)
        median = {sc: {k: float(np.median(v)) if len(v) else math.nan for k, v in per.items()} for sc, per in sums.items()}
        for scheme, per in sums.items():
            start.append(f"| {benchmark} | {scheme.upper()} | " + " | ".join(f"{median[scheme][k]:.3g}" for k in BOX_KINDS)
                         + f" | {float(np.mean(per['hidden'] < 1e-8)) if len(per['hidden']) else math.nan:.3g} |")
        explained = median["unas"]["hidden"] < 0.1 and median["unas"]["hidden"] < median["dnas"]["hidden"]
        contrasts = hidden_contrasts(plan, results, benchmark)
        if explained:
            engaged[benchmark] = contrasts
        summary.append(f"{benchmark}: at the start UNAS {'explains' if explained else 'does not explain'} the "
                       f"secondary-only boxes away (median column sum {median['unas']['hidden']:.2g}, DNAS "
                       f"{median['dnas']['hidden']:.2g}; trained UNAS mean {stats['UNAS']['col_hidden'][0]:.2g}); "
                       f"accuracy {' > '.join(order)}; acc_hidden against UNAS: "
                       + ", ".join(f"{name} {c.difference:+.3f} ({c.verdict})" for name, c in contrasts.items()))
    if not summary:
        return not_tested(NAME, TITLE, PAPER, CLAIM, "no VQA run finished: " + "; ".join(failures[:3]))
    verdict, reason = judge(engaged)
    figures = [plot_initial(initial, Path(out_dir) / "multiview_vqa_initial_col_sums.png").name]
    details = ["Trained (test set; column sums: mean over boxes and fusion layers):", "", *trained, "",
               "At the start (identity projections, first 100 test images):", "", *start, "",
               *[f"- failed: {f}" for f in failures]]
    return ClaimResult(
        name=NAME, title=TITLE, source=PAPER, paper=CLAIM, ours="; ".join(summary),
        setting=plan.setting_text("vqa") + "; mirror: " + " ".join(BENCHMARKS["mirror"]),
        seeds=", ".join(map(str, plan.seeds)), verdict=verdict, reason=reason,
        details="\n".join(details), figures=figures,
    )

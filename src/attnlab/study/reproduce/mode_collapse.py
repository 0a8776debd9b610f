"""Claim: mode collapse (DNAS paper, App. E, Figs. 6-9).

The paper's statement: attention that normalizes over keys (UNAS) pulls the points of a minority
cluster into the majority (mode collapse), and DNAS, normalizing over queries too, keeps them
apart; with balanced clusters both keep them.

The verdict rests on trained models: the `clusters` probe (count the clusters of unbalanced point
sets, tasks/probe/generators/clusters.py), DNAS against UNAS over seeds with compare's machinery
(reproduce/probe_evidence.py): *holds* when DNAS counts better and the probe tests its mechanism,
*contradicted* when UNAS is better or they are equivalent, *not tested* with the reason (the
interval; or the diagnostic that shows the mechanism did not engage: a shortcut that reaches the
schemes, or no positive control).

The toy needs no training and is shown as what the paper shows (not as evidence): 2-D, 500 points
around [1.8, 0.7] and 50 around [-1, -1] (covariance 0.1 I), Q = K = V = I, four attention steps
in which the points are replaced by the attention output (the library's `attention_weights`,
scores x_i . x_j / sqrt(2)); clusters counted by DBSCAN (scikit-learn, eps 0.3, min_samples 5,
noise not counted), eps about one standard deviation of the initial clusters.

1-D analysis (our derivation; the paper's Eq. 13/14 analyse the same quantity, the distance
between the two cluster centres after one step as a function of r = N0/N1): N0 points at +a and
N1 at -a, score x_i x_j. A UNAS query at +-a gives total weight proportional to N0 e^{+-a^2} and
N1 e^{-+a^2} to the two clusters, so it moves to a tanh(log(r E^{+-1}) / 2), E = e^{2a^2}, and

    UNAS:  d'/d = [tanh(log(r E) / 2) - tanh(log(r / E) / 2)] / 2                     (Eq. 13 here)

DNAS first divides every key's column by its sum over queries, N0 e^{+-a^2} + N1 e^{-+a^2}; the
row normalization that follows is then UNAS with r replaced by the effective ratio

    r_eff = r (r + E) / (r E + 1),   DNAS:  d'/d = the UNAS formula at r_eff            (Eq. 14 here)

which lies between 1 and r: DNAS shrinks the imbalance that drives the collapse. The simulation
runs the library's UNAS/DNAS on N1 = 10 points at -a and N0 = r N1 at +a (float64).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from attnlab.attention import attention_weights
from attnlab.figures import save_png
from attnlab.study.compare.probes import ContrastSpec
from attnlab.study.evidence import ClaimResult, not_tested
from attnlab.study.reproduce import probe_evidence

NAME = "mode_collapse"
TITLE = "Mode collapse"
PAPER = "DNAS paper, App. E, Figs. 6-9"
CLAIM = ("UNAS attention collapses a minority cluster into the majority, DNAS keeps it apart "
         "(toy: 500+50 points, UNAS 1 cluster after 4 steps, DNAS 2; 225+225: both 2)")
PROBE = "clusters"
SPEC = ContrastSpec("dnas", "unas", "better")

SETTINGS = {"imbalanced": (500, 50), "balanced": (225, 225)}
CENTERS = ((1.8, 0.7), (-1.0, -1.0))
VARIANCE = 0.1
STEPS = 4
DBSCAN_EPS, DBSCAN_MIN_SAMPLES = 0.3, 5
A_VALUES = (0.5, 1.0, 1.5)
SIM_N1 = 10
SIM_N0 = (10, 15, 20, 30, 50, 100, 200, 500, 1000)  # r = N0 / 10 from 1 to 100
SCHEMES = ("unas", "dnas")


def runs(plan) -> list:
    # the toy needs no training; the verdict's evidence is the clusters probe, trained
    return probe_evidence.runs(plan, PROBE, SCHEMES)


# ----------------------------------------------------------------------------- 2-D experiment
def toy_points(n0: int, n1: int, seed: int = 0) -> torch.Tensor:
    """(n0 + n1, 2) float64: n0 points around CENTERS[0], then n1 around CENTERS[1]."""
    gen = torch.Generator().manual_seed(seed)
    blobs = [torch.tensor(c, dtype=torch.float64) + math.sqrt(VARIANCE) * torch.randn(n, 2, generator=gen,
             dtype=torch.float64) for c, n in zip(CENTERS, (n0, n1))]
    return torch.cat(blobs)


def attention_steps(points: torch.Tensor, scheme: str, steps: int = STEPS) -> list[torch.Tensor]:
    """[x_0, x_1, ..., x_steps]: x_{t+1} = W(x_t) x_t with Q = K = V = I."""
    out = [points]
    for _ in range(steps):
        x = out[-1][None, None]  # (B=1, H=1, N, 2)
        out.append(attention_weights(x, x, scheme=scheme)[0, 0] @ out[-1])
    return out


def count_clusters(points: torch.Tensor | np.ndarray) -> int:
    """The stated rule: DBSCAN clusters (eps 0.3, min_samples 5); noise points do not count."""
    from sklearn.cluster import DBSCAN

    labels = DBSCAN(eps=DBSCAN_EPS, min_samples=DBSCAN_MIN_SAMPLES).fit(np.asarray(points)).labels_
    return len(set(labels.tolist()) - {-1})


# ----------------------------------------------------------------------------- 1-D analysis
def unas_distance_ratio(r, a):
    """d'/d after one UNAS step for N0 = r N1 points at +a and N1 at -a (closed form)."""
    r, e = np.asarray(r, dtype=np.float64), np.exp(2.0 * np.asarray(a, dtype=np.float64) ** 2)
    return 0.5 * (np.tanh(0.5 * np.log(r * e)) - np.tanh(0.5 * np.log(r / e)))


def dnas_distance_ratio(r, a):
    """d'/d after one DNAS step: the UNAS formula at r_eff = r (r + E) / (r E + 1)."""
    r, e = np.asarray(r, dtype=np.float64), np.exp(2.0 * np.asarray(a, dtype=np.float64) ** 2)
    return unas_distance_ratio(r * (r + e) / (r * e + 1.0), a)


def simulated_distance_ratio(n0: int, n1: int, a: float, scheme: str) -> float:
    """One step of the library's attention on the 1-D toy; d'/d of the two cluster centres."""
    x = torch.cat([torch.full((n0, 1), a, dtype=torch.float64), torch.full((n1, 1), -a, dtype=torch.float64)])
    y = attention_steps(x, scheme, steps=1)[1][:, 0]
    return float((y[:n0].mean() - y[n0:].mean()) / (2 * a))


def one_d_comparison() -> tuple[list[dict], float]:
    """Closed form vs simulation for every (a, r, scheme); the maximum absolute difference."""
    rows, worst = [], 0.0
    closed = {"unas": unas_distance_ratio, "dnas": dnas_distance_ratio}
    for a in A_VALUES:
        for n0 in SIM_N0:
            for scheme, formula in closed.items():
                sim = simulated_distance_ratio(n0, SIM_N1, a, scheme)
                exact = float(formula(n0 / SIM_N1, a))
                worst = max(worst, abs(sim - exact))
                rows.append({"a": a, "r": n0 / SIM_N1, "scheme": scheme, "closed": exact, "simulated": sim})
    return rows, worst


# ----------------------------------------------------------------------------- plots
def plot_steps(trajectories: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(trajectories), STEPS + 1, figsize=(2.3 * (STEPS + 1), 2.2 * len(trajectories)),
                             squeeze=False, constrained_layout=True)
    for row, ((setting, scheme), (xs, n0, counts)) in zip(axes, trajectories.items()):
        for t, (ax, x) in enumerate(zip(row, xs)):
            ax.scatter(x[:n0, 0], x[:n0, 1], s=3, c="tab:blue")
            ax.scatter(x[n0:, 0], x[n0:, 1], s=3, c="tab:red")
            ax.set_xlim(-2.2, 3.2)
            ax.set_ylim(-2.2, 2.2)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(f"step {t}: {counts[t]} cluster{'s' if counts[t] != 1 else ''}", fontsize=8)
        row[0].set_ylabel(f"{scheme.upper()}\n{setting}", fontsize=8)
    return save_png(fig, path, dpi=90)


def plot_one_d(rows: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6), constrained_layout=True)
    grid = np.logspace(0, 2, 200)
    for a, color in zip(A_VALUES, ("tab:blue", "tab:orange", "tab:green")):
        ax.plot(grid, unas_distance_ratio(grid, a), color=color, label=f"UNAS a={a}")
        ax.plot(grid, dnas_distance_ratio(grid, a), color=color, ls="--", label=f"DNAS a={a}")
        for scheme, marker in (("unas", "o"), ("dnas", "x")):
            pts = [(r["r"], r["simulated"]) for r in rows if r["a"] == a and r["scheme"] == scheme]
            ax.scatter(*zip(*pts), color=color, marker=marker, s=14)
    ax.set_xscale("log")
    ax.set_xlabel("r = N0 / N1")
    ax.set_ylabel("centre distance after one step / before")
    ax.set_title("1-D toy: closed form (lines) vs simulation (markers)", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    return save_png(fig, path, dpi=100)


# ----------------------------------------------------------------------------- the claim
def evaluate(plan, results, out_dir: Path) -> ClaimResult:
    out_dir = Path(out_dir)
    trajectories, final = {}, {}
    for setting, (n0, n1) in SETTINGS.items():
        for scheme in ("unas", "dnas"):
            xs = attention_steps(toy_points(n0, n1), scheme)
            counts = [count_clusters(x) for x in xs]
            trajectories[(setting, scheme)] = (xs, n0, counts)
            final[(setting, scheme)] = counts[-1]
    rows, worst = one_d_comparison()
    dnas_keeps_more = all(r_d["closed"] >= r_u["closed"] - 1e-12 for r_u, r_d in zip(rows[::2], rows[1::2]))
    figures = [plot_steps(trajectories, out_dir / "mode_collapse_steps.png").name,
               plot_one_d(rows, out_dir / "mode_collapse_1d.png").name]
    toy_text = (f"toy (untrained, not evidence): clusters after {STEPS} steps: 500+50 UNAS "
                f"{final[('imbalanced', 'unas')]}, DNAS {final[('imbalanced', 'dnas')]}; 225+225 UNAS "
                f"{final[('balanced', 'unas')]}, DNAS {final[('balanced', 'dnas')]}. 1-D: closed form = "
                f"simulation (max |diff| {worst:.1e}); DNAS keeps the centres at least as far apart "
                f"as UNAS for every r >= 1 and a tested: {'yes' if dnas_keeps_more else 'no'}")
    table = ["| a | r | UNAS closed | UNAS simulated | DNAS closed | DNAS simulated |", "|---|---|---|---|---|---|"]
    for r_u, r_d in zip(rows[::2], rows[1::2]):
        table.append(f"| {r_u['a']} | {r_u['r']:g} | {r_u['closed']:.4f} | {r_u['simulated']:.4f} | "
                     f"{r_d['closed']:.4f} | {r_d['simulated']:.4f} |")
    toy_details = ["", "The paper's toy (no training; shown, not evidence):", "", toy_text, "", *table]
    evidence = probe_evidence.evaluate(plan, results, PROBE, (SPEC,))
    if evidence is None:
        reason = probe_evidence.untrained(plan, PROBE)
        return not_tested(NAME, TITLE, PAPER, CLAIM, reason, ours=toy_text,
                          details="\n".join(toy_details), figures=figures)
    verdict, reason = evidence.verdict(SPEC)
    details = [f"Evidence: the {PROBE} probe, {evidence.seeds} seeds each, the probe's learning rate:",
               "", *probe_evidence.cells_table(evidence), *toy_details]
    return ClaimResult(
        name=NAME, title=TITLE, source=PAPER, paper=CLAIM, ours=evidence.text(SPEC),
        setting=f"probe={PROBE}; toy: 2-D, Q = K = V = I, {STEPS} steps, DBSCAN eps {DBSCAN_EPS}",
        seeds=f"1-{evidence.seeds}", verdict=verdict, reason=reason,
        details="\n".join(details), figures=figures)

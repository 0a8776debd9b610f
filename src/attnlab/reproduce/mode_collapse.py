"""Claim: mode collapse (DNAS paper, App. E, Figs. 6-9). No training: attention steps on toy points.

2-D experiment: 500 points around [1.8, 0.7] and 50 around [-1, -1] (covariance 0.1 I), Q = K = V
= I, four attention steps in which the points are replaced by the attention output (the library's
`attention_weights`, scores x_i . x_j / sqrt(2)). Paper: UNAS collapses the two clusters into one,
DNAS keeps two; with 225 + 225 points both keep two. Clusters are counted with DBSCAN
(scikit-learn, eps 0.3, min_samples 5, noise points not counted), eps being about one standard
deviation of the initial clusters: two groups count as one once they touch.

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
from attnlab.reproduce import learned_evidence
from attnlab.reproduce.plan import Plan
from attnlab.reproduce.results import HOLDS, NOT_AT_SCALE, ClaimResult, Results

NAME = "mode_collapse"
TITLE = "Mode collapse"
PAPER = "DNAS paper, App. E, Figs. 6-9"
CLAIM = ("500+50 points: UNAS collapses to one cluster in 4 steps, DNAS keeps two; 225+225: both keep two. "
         "1-D: DNAS keeps the cluster centres farther apart than UNAS as r = N0/N1 grows (Fig. 7)")

SETTINGS = {"imbalanced": (500, 50), "balanced": (225, 225)}
CENTERS = ((1.8, 0.7), (-1.0, -1.0))
VARIANCE = 0.1
STEPS = 4
DBSCAN_EPS, DBSCAN_MIN_SAMPLES = 0.3, 5
A_VALUES = (0.5, 1.0, 1.5)
SIM_N1 = 10
SIM_N0 = (10, 15, 20, 30, 50, 100, 200, 500, 1000)  # r = N0 / 10 from 1 to 100
SCHEMES = ("unas", "dnas")


def runs(plan: Plan) -> list:
    # the toy needs no training; tasks whose card enters the claim (the clusters probe) train
    # UNAS and DNAS, whose scores the report adds as the learned setting's evidence
    return learned_evidence.runs(plan, NAME, SCHEMES)


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
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


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
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------- the claim
def evaluate(plan: Plan, results: Results, out_dir: Path) -> ClaimResult:
    trajectories, final = {}, {}
    for setting, (n0, n1) in SETTINGS.items():
        for scheme in ("unas", "dnas"):
            xs = attention_steps(toy_points(n0, n1), scheme)
            counts = [count_clusters(x) for x in xs]
            trajectories[(setting, scheme)] = (xs, n0, counts)
            final[(setting, scheme)] = counts[-1]
    rows, worst = one_d_comparison()
    dnas_keeps_more = all(r_d["closed"] >= r_u["closed"] - 1e-12 for r_u, r_d in zip(rows[::2], rows[1::2]))
    expected = {("imbalanced", "unas"): 1, ("imbalanced", "dnas"): 2, ("balanced", "unas"): 2,
                ("balanced", "dnas"): 2}
    holds = final == expected and worst < 1e-9 and dnas_keeps_more
    figures = [plot_steps(trajectories, out_dir / "mode_collapse_steps.png").name,
               plot_one_d(rows, out_dir / "mode_collapse_1d.png").name]
    ours = (f"clusters after {STEPS} steps: 500+50 UNAS {final[('imbalanced', 'unas')]}, DNAS "
            f"{final[('imbalanced', 'dnas')]}; 225+225 UNAS {final[('balanced', 'unas')]}, DNAS "
            f"{final[('balanced', 'dnas')]}. 1-D: closed form = simulation (max |diff| {worst:.1e}); "
            f"DNAS keeps the centres at least as far apart as UNAS for every r >= 1 and a tested: "
            f"{'yes' if dnas_keeps_more else 'no'}")
    table = ["| a | r | UNAS closed | UNAS simulated | DNAS closed | DNAS simulated |", "|---|---|---|---|---|---|"]
    for r_u, r_d in zip(rows[::2], rows[1::2]):
        table.append(f"| {r_u['a']} | {r_u['r']:g} | {r_u['closed']:.4f} | {r_u['simulated']:.4f} | "
                     f"{r_d['closed']:.4f} | {r_d['simulated']:.4f} |")
    trained, sentences = learned_evidence.compare(plan, results, NAME, SCHEMES)
    if sentences:
        ours += ". Trained (verdict from the toy only): " + "; ".join(sentences)
    if trained:
        intro = "Trained models on the tasks whose card enters this claim (the verdict rests on the toy alone):"
        table += ["", intro, "", *trained]
    return ClaimResult(
        name=NAME, title=TITLE, source=PAPER,
        paper=CLAIM,
        ours=ours,
        setting=f"2-D toy, Q = K = V = I, {STEPS} steps; clusters: DBSCAN eps {DBSCAN_EPS}, min_samples "
                f"{DBSCAN_MIN_SAMPLES}; 1-D: a in {A_VALUES}, N1 = {SIM_N1}, r in 1..100",
        seeds="data seed 0 (no training)",
        verdict=HOLDS if holds else NOT_AT_SCALE,
        details=__doc__.split("\n\n", 1)[1] + "\n" + "\n".join(table),
        figures=figures,
    )

"""Minority cluster: unbalanced clusters of points; count the clusters or find the smallest one.

A sequence is `num_points` points in `dim` dimensions (float inputs, no tokens, no padding)
drawn around min_clusters..max_clusters centres (2..5): one minority cluster of `minority_size` points, the other clusters
sharing the rest in random, unbalanced proportions (each larger than the minority one). The
centres lie on the sphere of radius `radius`, at least `min_separation` apart, and the points
scatter around them with Gaussian `noise`, far less than the separation, so the clusters are
unambiguous (a single-linkage clustering recovers them; the tests check it). Targets:
    target="count"   the number of clusters, a class (num_classes = max_clusters + 1);
    target="centre"  the minority cluster's centre as the inputs show it (the mean of its
                     points), a regression target (n, dim).

This is the DNAS paper's mode-collapse argument (App. E; attnlab.study.reproduce.mode_collapse
simulates it with fixed Q = K = V = I), with learned projections instead: layers of softmax
attention over keys pull every point toward the heavily weighted majority, so after a few layers
the minority cluster is absorbed; normalizing over queries too shrinks the imbalance that drives
the collapse. A model that collapses undercounts the clusters and answers the centre with
something near the global mean (the `collapsed` predictions in `meta`); keeping the minority
apart is what the probe rewards.

No generator in Zoology or the Long Range Arena is followed.

Trivial baselines: "chance" for the count, a uniform guess over min_clusters..max_clusters
(theory: 1 / the number of possible counts); "mean" for the centre, the centres' average over
the distribution (the origin), whose mean squared error per coordinate is
radius^2 / dim + noise^2 / minority_size (theory: the centre's norm is `radius` exactly and
the mean of its points adds noise of variance noise^2 / minority_size).

Shortcut features (target="count" only; no shortcut rule): per row, the norm of the points'
mean, the upper triangle (diagonal included) of their second-moment matrix (the mean of x x^T),
their mean squared distance to the mean, and the eigenvalues of their covariance matrix in
ascending order, float32 (n, 2 + dim (dim + 1) / 2 + dim). All are functions of the points' first
and second moments, which one layer of uniform (collapsed) attention can pool. The count shows
in the covariance's rank (k clusters: k - 1 eigenvalues above the noise, with dim >= k - 1),
which a linear classifier cannot read off the raw moments but can off the eigenvalues: at the
defaults a linear classifier fitted on 4096 rows scores 0.72 on fresh rows with the moments
alone and 0.96 with the eigenvalues too (the review reported ~0.98). The datamodule fits one on
the training rows; a scheme that only matches it has not shown that it keeps the minority apart.
"""

from __future__ import annotations

import numpy as np
import torch

from tasks.probe.data import (
    REGRESSION,
    SEQUENCE_CLASS,
    Baseline,
    ProbeData,
    chance_predictions,
    check_positive,
    rng_for,
    score,
)

TARGETS = ("count", "centre")


def _centres(rng: np.random.Generator, n: int, k: int, dim: int, radius: float, sep: float):
    """(n, k, dim) centres on the sphere, pairwise at least `sep` apart (rows redrawn until so)."""
    centres = np.empty((n, k, dim))
    todo = np.arange(n)
    for _ in range(1000):
        draw = rng.standard_normal((len(todo), k, dim))
        draw *= radius / np.linalg.norm(draw, axis=2, keepdims=True)
        dist = np.linalg.norm(draw[:, :, None] - draw[:, None, :], axis=3)
        dist[:, np.arange(k), np.arange(k)] = np.inf
        ok = dist.min(axis=(1, 2)) >= sep
        centres[todo[ok]] = draw[ok]
        todo = todo[~ok]
        if len(todo) == 0:
            return centres
    raise ValueError(
        f"cannot place {k} centres {sep} apart on a sphere of radius {radius} in {dim} "
        f"dimensions; pass a smaller min_separation or max_clusters, or a larger dim"
    )


def generate(
    n: int,
    seed: int,
    *,
    target: str = "count",
    num_points: int = 32,
    dim: int = 4,
    min_clusters: int = 2,
    max_clusters: int = 5,
    minority_size: int = 2,
    noise: float = 0.05,
    radius: float = 1.0,
    min_separation: float = 1.0,
) -> ProbeData:
    """`n` sets of `num_points` points around min_clusters..max_clusters centres."""
    check_positive(n=n, num_points=num_points, dim=dim, minority_size=minority_size)
    if target not in TARGETS:
        raise ValueError(f"target={target!r} is not a cluster target; use one of {TARGETS}")
    if not 2 <= min_clusters <= max_clusters:
        raise ValueError(f"need 2 <= min_clusters={min_clusters} <= max_clusters={max_clusters}")
    n, m, big = int(n), int(minority_size), int(num_points) - int(minority_size)
    if big < (max_clusters - 1) * (m + 1):
        raise ValueError(
            f"num_points={num_points} cannot hold a minority of {m} and {max_clusters - 1} "
            f"larger clusters; pass num_points >= {m + (max_clusters - 1) * (m + 1)}"
        )
    rng = rng_for(seed)
    counts = rng.integers(min_clusters, max_clusters + 1, size=n)
    centres = _centres(rng, n, int(max_clusters), int(dim), float(radius), float(min_separation))

    # sizes: cluster 0 is the minority; the others get m + 1 each and the rest in
    # Dirichlet(1) proportions (unbalanced), the unused clusters of a row none
    sizes = np.zeros((n, int(max_clusters)), dtype=np.int64)
    sizes[:, 0] = m
    for row in range(n):
        majors = int(counts[row]) - 1
        spare = big - majors * (m + 1)
        sizes[row, 1 : 1 + majors] = m + 1 + rng.multinomial(spare, rng.dirichlet(np.ones(majors)))
    membership = np.stack([np.repeat(np.arange(max_clusters), s) for s in sizes])
    membership = np.take_along_axis(membership, np.argsort(rng.random(membership.shape)), axis=1)
    points = np.take_along_axis(centres, membership[:, :, None], axis=1)
    points = points + float(noise) * rng.standard_normal(points.shape)
    inputs = torch.from_numpy(points).float()

    collapsed = inputs.mean(dim=1)
    features = None
    if target == "count":
        x = inputs.double()
        second = torch.einsum("npi,npj->nij", x, x) / x.shape[1]
        upper = torch.triu_indices(int(dim), int(dim))
        centred = x - x.mean(dim=1, keepdim=True)
        spread = (centred**2).sum(dim=2).mean(dim=1)
        covariance = torch.einsum("npi,npj->nij", centred, centred) / x.shape[1]
        features = torch.cat([x.mean(dim=1).norm(dim=1, keepdim=True),
                              second[:, upper[0], upper[1]], spread[:, None],
                              torch.linalg.eigvalsh(covariance)], dim=1).float()
    if target == "count":
        targets = torch.from_numpy(counts).long()
        guesses = chance_predictions(rng, targets, np.arange(min_clusters, max_clusters + 1))
        baseline = Baseline(
            "chance", guesses, score(SEQUENCE_CLASS, guesses, targets),
            1 / (max_clusters - min_clusters + 1),
        )
        kind, num_classes = SEQUENCE_CLASS, int(max_clusters) + 1
    else:
        minority = torch.from_numpy(membership == 0)
        targets = (inputs * minority[:, :, None]).sum(dim=1) / m
        guesses = torch.zeros_like(targets)
        theory = float(radius) ** 2 / int(dim) + float(noise) ** 2 / m
        baseline = Baseline("mean", guesses, score(REGRESSION, guesses, targets), theory)
        kind, num_classes = REGRESSION, 0
    return ProbeData(
        inputs=inputs,
        targets=targets,
        padding_mask=torch.zeros(inputs.shape[:2], dtype=torch.bool),
        target_kind=kind,
        num_classes=num_classes,
        vocab_size=0,
        baseline=baseline,
        meta={
            "membership": torch.from_numpy(membership),  # cluster of each point; 0 = minority
            "num_clusters": torch.from_numpy(counts),
            "collapsed": collapsed,  # every point collapsed to one: the global mean
        },
        shortcut_features=features,
    )

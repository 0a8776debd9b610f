"""Repulsive attention (An et al., EMNLP 2020) and the MA+R disagreement regularizer (Li et al. 2018).

`RepulsiveAttention` is a training rule, not an architecture: the heads of one attention module are
M particles `theta_1..theta_M` of a posterior, and after backward (after DDP has averaged the
gradients: `on_before_optimizer_step`) the gradient of every particle is replaced by the SVGD
direction. With `g_j = dL/dtheta_j` (L = -log p up to a constant) and an RBF kernel
`k(a, b) = exp(-|a - b|^2 / (2h))`, SVGD moves `theta_i` along

    phi(theta_i) = (1/M) sum_j [ k(theta_j, theta_i) (-g_j) + alpha grad_{theta_j} k(theta_j, theta_i) ]

so the optimizer, which descends, gets `step_size * (-phi)`: the kernel-smoothed gradient minus
`alpha` times the repulsive force that pushes heads apart. The bandwidth is the median heuristic
of the published code, `h = 0.5 med / log(M + 1)`, with `med` the median of the M^2 entries of the
pairwise squared-distance matrix (diagonal included) and, for an even count, the mean of the two
middle values (numpy.median; the published Electra code's `svgd_kernel` averages the lower and
higher 50th percentiles; its PyTorch trainers call torch.median, which takes the lower one).

SPOS adds `beta g_i` and Gaussian noise. `spos_noise: paper` (default) is the paper's update
(Eq. 5): `- sqrt(2 beta / step_size) N(0, I)`. `spos_noise: grad_median` multiplies that noise by
`median|g|` of the particle set (torch.median), as the published PyTorch code does: about 1e-3 of
the paper's scale for typical gradients. The noise is drawn from a generator seeded by
(seed, step, module), so every DDP process injects the same noise and a resumed run the same as an
uninterrupted one. With Adam the overall scale `step_size` cancels out except against the SPOS
noise; the published code applies it the same way.

Particle of head h: rows [h*d:(h+1)*d] of `q_proj.weight`, `k_proj.weight` and `v_proj.weight` of
one `MultiHeadAttention` (the rows that produce head h; biases only with `include_bias=true`).
`grouping: joint` (default) concatenates a head's Q, K and V rows into one particle, the paper's
definition of a particle (a head's parameters). `grouping: per_projection` runs one kernel per
projection, as both published codes do; its heads are the same row blocks, which is how the
published fairseq trainer splits `in_proj_weight` (`.view(heads, -1)` per projection). The
published Electra code instead reshapes a TF kernel `[in, H*d]` to `[in*d, H]`, so its "head" h
collects the columns c with c mod H = h, taken from every head (a bug there); we do not copy it.
Modules without v_proj (VQA fusion, project_values=False) contribute Q and K only; modules with
a single head have no second particle and are skipped (said once).

A module may declare its particles instead: a method `particles()` returning parameters whose
first dimension has one row per particle (e.g. the classify task's `HopAttention`: the rows of
Lin et al.'s W_s2, one per attention hop, as the published code's SVGD). RepulsiveAttention then
moves those rows (`projections`, `grouping`, `include_bias` do not apply to it), and MA+R takes
the module's output (B, M, d) as the M particles' outputs.

`DisagreementRegularizer` (the paper's MA+R baseline) adds `weight * mean_{i,j} cos(O_i, O_j)` to
the training loss for every selected module (Li et al. 2018's disagreement on outputs, summed
over modules, averaged over positions): O_h is head h's output before the output projection.
The callback observes the head outputs through forward hooks and registers the term with the
task module (`TaskModule.register_loss_term`, at fit start; removed at fit end), whose
training_step adds it to the task's loss, so Lightning's gradient accumulation, AMP scaling and
DDP treat it as part of the loss; `train/disagreement` logs the weighted term.

Both rules are composed by the model config through Hydra defaults (`conf/rules/`, placed at
`callbacks.repulsive` / `callbacks.disagreement`), so `callbacks=minimal|none` keep them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import pytorch_lightning as pl
import torch
from torch import Tensor

from attnlab.attention import MultiHeadAttention, attention_modules
from attnlab.errors import ConfigError
from attnlab.loggers import LoggerAdapter
from attnlab.task_module import TaskModule

ROLES = ("encoder", "decoder", "cross")
PROJECTIONS = ("q", "k", "v")


# ----------------------------------------------------------------------------- the math
def rbf_kernel(theta: Tensor, bandwidth: float | None = None) -> tuple[Tensor, Tensor, float]:
    """K (M, M) with K_ij = k(theta_i, theta_j), the repulsive force
    R_i = sum_j grad_{theta_j} k(theta_j, theta_i) (M, P), and the bandwidth h."""
    m = theta.shape[0]
    sq = (theta[:, None, :] - theta[None, :, :]).pow(2).sum(-1)
    if bandwidth is None:
        # quantile 0.5 with midpoint interpolation = numpy.median (see the module docstring)
        median = torch.quantile(sq.flatten(), 0.5, interpolation="midpoint")
        bandwidth = float(0.5 * median / math.log(m + 1))
        if not bandwidth > 0:  # identical particles: any h gives K = 1 and no force
            bandwidth = 1.0
    kernel = torch.exp(-sq / (2 * bandwidth))
    force = (theta * kernel.sum(1, keepdim=True) - kernel @ theta) / bandwidth
    return kernel, force, bandwidth


def svgd_gradient(theta: Tensor, grad: Tensor, alpha: float = 1.0, bandwidth: float | None = None) -> Tensor:
    """-phi: what a descending optimizer must get so that theta moves along the SVGD direction."""
    kernel, force, _ = rbf_kernel(theta, bandwidth)
    return (kernel @ grad - alpha * force) / theta.shape[0]


SPOS_NOISE = ("paper", "grad_median")


def spos_gradient(theta: Tensor, grad: Tensor, alpha: float, beta: float, step_size: float,
                  generator: torch.Generator | None = None, bandwidth: float | None = None,
                  noise: str = "paper") -> Tensor:
    """SVGD plus Langevin: + beta g - sqrt(2 beta / step_size) N(0, I) (the paper's Eq. 5), the
    noise times median|g| with noise="grad_median" (the published PyTorch code)."""
    if noise not in SPOS_NOISE:
        raise ConfigError(f"spos_noise={noise!r}: use {' or '.join(SPOS_NOISE)}")
    draw = torch.randn(theta.shape, generator=generator, dtype=theta.dtype).to(theta.device)
    scale = math.sqrt(2.0 * beta / step_size)
    if noise == "grad_median":
        scale = scale * grad.abs().flatten().median()
    return svgd_gradient(theta, grad, alpha, bandwidth) + beta * grad - scale * draw


def head_rows(param: Tensor, num_heads: int) -> Tensor:
    """(H*d, ...) weight or bias -> (H, d * ...): row block h is head h's particle part."""
    return param.reshape(num_heads, -1)


def particle_parameters(module: MultiHeadAttention, projections: Sequence[str], include_bias: bool) -> list[Tensor]:
    """The parameters whose row blocks make the particles, in a fixed order."""
    params = []
    for name in projections:
        linear = getattr(module, f"{name}_proj", None)
        if linear is None:  # project_values=False: no v_proj
            continue
        params.append(linear.weight)
        if include_bias and linear.bias is not None:
            params.append(linear.bias)
    return params


def particle_count(module: MultiHeadAttention) -> int:
    """Particles of a module: the rows of its declared `particles()` (e.g. attention hops), else its heads."""
    declared = getattr(module, "particles", None)
    return int(declared()[0].shape[0]) if declared is not None else module.num_heads


def select_modules(model, stacks: Sequence[str], layers) -> list[tuple[str, MultiHeadAttention]]:
    """Attention modules of the chosen roles; `layers` all | first | last | [indices], counted
    within each role (stack) in named_modules() order."""
    chosen = []
    for role in stacks:
        mods = [(n, m) for n, m in attention_modules(model) if m.role == role]
        if layers == "all":
            chosen += mods
        elif layers == "first":
            chosen += mods[:1]
        elif layers == "last":
            chosen += mods[-1:]
        else:
            chosen += [mods[i] for i in layers if -len(mods) <= i < len(mods)]
    return chosen


def _check(stacks, layers, projections) -> tuple[list[str], object, list[str]]:
    stacks = [stacks] if isinstance(stacks, str) else list(stacks)
    bad = [s for s in stacks if s not in ROLES]
    if bad:
        raise ConfigError(f"stacks={bad}: choose from {', '.join(ROLES)}")
    projections = [projections] if isinstance(projections, str) else list(projections)
    bad = [p for p in projections if p not in PROJECTIONS]
    if bad or not projections:
        raise ConfigError(f"projections={projections}: choose a non-empty subset of q, k, v")
    if isinstance(layers, str):
        if layers not in ("all", "first", "last"):
            raise ConfigError(f"layers={layers!r}: use all, first, last or a list of layer indices")
    else:
        layers = [int(i) for i in layers]
    return stacks, layers, projections


# ----------------------------------------------------------------------------- SVGD / SPOS
class RepulsiveAttention(pl.Callback):
    """Per-head Q/K/V particles updated as SVGD or SPOS particles (see the module docstring)."""

    def __init__(
        self,
        method: str = "svgd",
        step_size: float = 0.1,
        alpha: float = 0.01,
        beta: float = 0.1,
        projections: Sequence[str] = PROJECTIONS,
        stacks: Sequence[str] = ROLES,
        layers="all",
        grouping: str = "joint",
        include_bias: bool = False,
        spos_noise: str = "paper",
        seed: int = 0,
        log_every_n_steps: int = 50,
    ) -> None:
        if method not in ("svgd", "spos"):
            raise ConfigError(f"callbacks.repulsive.method={method!r}: use svgd or spos")
        if spos_noise not in SPOS_NOISE:
            raise ConfigError(f"callbacks.repulsive.spos_noise={spos_noise!r}: use "
                              f"{' or '.join(SPOS_NOISE)}")
        if grouping not in ("joint", "per_projection"):
            raise ConfigError(f"callbacks.repulsive.grouping={grouping!r}: use joint or "
                              f"per_projection")
        if step_size <= 0 or alpha < 0 or beta < 0:
            raise ConfigError(
                f"callbacks.repulsive: step_size={step_size}, alpha={alpha}, beta={beta}: step_size "
                f"must be > 0, alpha and beta >= 0"
            )
        self.method, self.step_size, self.alpha, self.beta = method, float(step_size), float(alpha), float(beta)
        self.stacks, self.layers, self.projections = _check(stacks, layers, projections)
        self.grouping, self.include_bias = grouping, bool(include_bias)
        self.spos_noise = spos_noise
        self.seed, self.log_every_n_steps = int(seed), max(1, int(log_every_n_steps))
        self._announced = False

    def groups(self, model) -> list[tuple[str, MultiHeadAttention, list[list[Tensor]]]]:
        """(name, module, [parameter lists, one per particle set]) of every module it updates."""
        out = []
        for name, module in select_modules(model, self.stacks, self.layers):
            if particle_count(module) < 2:
                continue
            if hasattr(module, "particles"):  # declared by the module (see the module docstring)
                out.append((name, module, [list(module.particles())]))
                continue
            params = particle_parameters(module, self.projections, self.include_bias)
            if not params:
                continue
            if self.grouping == "joint":
                sets = [params]
            else:  # one particle set per projection (its weight and, if included, its bias)
                sets = [particle_parameters(module, [p], self.include_bias) for p in self.projections]
                sets = [s for s in sets if s]
            out.append((name, module, sets))
        return out

    def direction(self, theta: Tensor, grad: Tensor, generator: torch.Generator) -> Tensor:
        if self.method == "svgd":
            d = svgd_gradient(theta, grad, self.alpha)
        else:
            d = spos_gradient(theta, grad, self.alpha, self.beta, self.step_size, generator,
                              noise=self.spos_noise)
        return self.step_size * d

    @torch.no_grad()
    def apply(self, model, step: int = 0) -> dict[str, float]:
        """Replace the gradients of every particle set by the SVGD/SPOS direction (in place)."""
        distances = []
        for index, (_, module, sets) in enumerate(self.groups(model)):
            h = particle_count(module)
            for j, params in enumerate(sets):
                if any(p.grad is None for p in params):
                    continue
                theta = torch.cat([head_rows(p.float(), h) for p in params], dim=1)
                grad = torch.cat([head_rows(p.grad.float(), h) for p in params], dim=1)
                generator = torch.Generator().manual_seed(hash((self.seed, step, index, j)) % 2**63)
                new = self.direction(theta, grad, generator)
                offset = 0
                for p in params:
                    width = p.numel() // h
                    p.grad.copy_(new[:, offset : offset + width].reshape(p.shape).to(p.grad.dtype))
                    offset += width
                distances.append(float(torch.pdist(theta).mean()))
        return {"repulsive/particle_distance": sum(distances) / len(distances)} if distances else {}

    def on_fit_start(self, trainer, pl_module) -> None:
        if self._announced:
            return
        self._announced = True
        groups = self.groups(pl_module)
        chosen = select_modules(pl_module, self.stacks, self.layers)
        single = [n for n, m in chosen if particle_count(m) < 2]
        declared = [n for n, m, _ in groups if hasattr(m, "particles")]
        msg = (f"[attnlab] repulsive attention ({self.method}): {len(groups)} attention modules, "
               f"particles = per-head rows of {'/'.join(self.projections)}_proj"
               f"{' (+bias)' if self.include_bias else ''} ({self.grouping})")
        if declared:
            msg += f"; declared particles() (e.g. attention hops) of {declared}"
        if single:
            msg += f"; skipped {len(single)} single-head module(s) (one particle, nothing to repel): {single}"
        if not groups:
            msg += "; NOTHING to update: the training rule has no effect on this model"
        if trainer.is_global_zero:
            print(msg)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        step = int(trainer.global_step)
        stats = self.apply(pl_module, step)
        if stats and step % self.log_every_n_steps == 0:
            LoggerAdapter(trainer).scalars(stats, step=step)


# ----------------------------------------------------------------------------- MA+R
def disagreement(head_outputs: Tensor) -> Tensor:
    """mean_{i,j} cos(O_i, O_j) over head pairs (diagonal included, as Li et al.'s D) and over
    positions where every head has a non-zero output (padded queries have none).
    head_outputs: (..., H, d)."""
    unit = torch.nn.functional.normalize(head_outputs.float(), dim=-1, eps=1e-12)
    cos = unit @ unit.transpose(-1, -2)  # (..., H, H)
    per_position = cos.mean(dim=(-1, -2))
    valid = (head_outputs != 0).any(-1).all(-1)
    if not valid.any():
        return per_position.sum() * 0.0
    return per_position[valid].mean()


class DisagreementRegularizer(pl.Callback):
    """MA+R: loss += weight * sum over selected modules of disagreement(head outputs)."""

    TERM = "disagreement"

    def __init__(self, weight: float = 0.1, stacks: Sequence[str] = ROLES, layers="all") -> None:
        if weight < 0:
            raise ConfigError(f"callbacks.disagreement.weight={weight}: give a weight >= 0")
        self.weight = float(weight)
        self.stacks, self.layers, _ = _check(stacks, layers, PROJECTIONS)
        self._terms: list[Tensor] = []
        self._handles: list = []

    def _collect(self, module: MultiHeadAttention, merged: Tensor) -> None:
        if module.training and torch.is_grad_enabled():
            if hasattr(module, "particles"):  # its output (B, M, d) holds the particles' outputs
                self._terms.append(disagreement(merged))
                return
            b, s, e = merged.shape
            self._terms.append(disagreement(merged.view(b, s, module.num_heads, e // module.num_heads)))

    def loss_term(self, _module) -> Tensor | None:
        """weight * the disagreement of this step's forward (None when nothing was observed)."""
        if not self._terms:
            return None
        penalty = torch.stack(self._terms).sum()
        self._terms.clear()
        return self.weight * penalty

    def on_fit_start(self, trainer, pl_module) -> None:
        if not isinstance(pl_module, TaskModule):
            cls = type(pl_module)
            raise ConfigError(
                f"model=mar adds its disagreement through TaskModule.register_loss_term, but the "
                f"task's module {cls.__module__}.{cls.__name__} is not a TaskModule: build it on "
                f"attnlab.task_module.TaskModule, or choose another model"
            )
        mods = [(n, m) for n, m in select_modules(pl_module, self.stacks, self.layers) if particle_count(m) > 1]
        for _, m in mods:
            if m.out_proj is not None and not hasattr(m, "particles"):  # its input is the concatenation of the head outputs
                hook = m.out_proj.register_forward_pre_hook(
                    functools.partial(lambda mod, _lin, args: self._collect(mod, args[0]), m))
            else:  # project_values=False: the module's output is the concatenation
                hook = m.register_forward_hook(lambda mod, _args, out: self._collect(mod, out))
            self._handles.append(hook)
        self._terms.clear()
        pl_module.register_loss_term(self.TERM, self.loss_term)
        if trainer.is_global_zero:
            print(f"[attnlab] MA+R disagreement regularizer (weight {self.weight}) on {len(mods)} "
                  f"attention modules")

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._terms.clear()  # only this step's forward counts

    def on_fit_end(self, trainer, pl_module) -> None:
        self.teardown(trainer, pl_module, "fit")

    def teardown(self, trainer, pl_module, stage: str) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._terms.clear()
        if isinstance(pl_module, TaskModule):
            pl_module.remove_loss_term(self.TERM)

"""Repulsive attention (SVGD / SPOS over per-head particles) and the MA+R regularizer."""

import functools
import math

import pytest
import pytorch_lightning as pl
import torch
from torch import nn

from attnlab.attention import (
    MultiHeadAttention,
    TransformerDecoderLayer,
    TransformerEncoderLayer,
    record_attention,
)
from attnlab.callbacks import DisagreementRegularizer, RepulsiveAttention
from attnlab.callbacks.repulsive import (
    disagreement,
    head_rows,
    rbf_kernel,
    select_modules,
    spos_gradient,
    svgd_gradient,
)
from attnlab.errors import ConfigError
from attnlab.task_module import TaskModule

THETA = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0]], dtype=torch.float64)
GRAD = torch.tensor([[0.5, -1.0], [2.0, 0.25], [-0.75, 1.5]], dtype=torch.float64)


def phi_by_the_formula(theta, grad, alpha, h):
    """phi(theta_i) = 1/M sum_j [k(theta_j, theta_i) (-g_j) + alpha grad_{theta_j} k(theta_j, theta_i)],
    k(a, b) = exp(-|a - b|^2 / (2h)); the kernel gradient by autograd, one pair at a time."""
    m = theta.shape[0]
    phi = torch.zeros_like(theta)
    for i in range(m):
        for j in range(m):
            tj = theta[j].clone().requires_grad_(True)
            k = torch.exp(-(tj - theta[i]).pow(2).sum() / (2 * h))
            (dk,) = torch.autograd.grad(k, tj)
            phi[i] += k.detach() * (-grad[j]) + alpha * dk
    return phi / m


def test_median_bandwidth_of_the_hand_made_case():
    # squared distances 1 (0-1), 4 (0-2), 5 (1-2): the 9 entries' median is 1, h = 0.5 / log 4
    _, _, h = rbf_kernel(THETA)
    assert h == pytest.approx(0.5 / math.log(4))


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_svgd_direction_on_three_particles_equals_the_formula(alpha):
    h = 0.5 / math.log(4)
    expected = -phi_by_the_formula(THETA, GRAD, alpha, h)  # what the (descending) optimizer gets
    torch.testing.assert_close(svgd_gradient(THETA, GRAD, alpha), expected)
    torch.testing.assert_close(svgd_gradient(THETA, GRAD, alpha, bandwidth=0.7),
                               -phi_by_the_formula(THETA, GRAD, alpha, 0.7))


def test_repulsion_pushes_particles_apart():
    zero = torch.zeros_like(GRAD)
    step = -svgd_gradient(THETA, zero, alpha=1.0)  # no data gradient: the move is pure repulsion
    moved = THETA + 0.1 * step
    assert torch.pdist(moved).min() > torch.pdist(THETA).min()
    assert torch.pdist(moved).sum() > torch.pdist(THETA).sum()


def test_median_bandwidth_averages_the_two_middle_values_of_an_even_count():
    # 4 particles on a line at 0, 1, 3, 6: the 16 entries of the squared-distance matrix sorted are
    # 0 0 0 0 1 1 4 4 | 9 9 9 9 25 25 36 36; their median (numpy.median, the published code's
    # mean of the lower and higher 50th percentiles) is (4 + 9) / 2, not the lower middle value 4
    line = torch.tensor([[0.0], [1.0], [3.0], [6.0]], dtype=torch.float64)
    _, _, h = rbf_kernel(line)
    assert h == pytest.approx(0.5 * 6.5 / math.log(5))


def test_spos_adds_the_langevin_terms_of_the_paper():
    # Eq. 5 of the paper: + beta g - sqrt(2 beta / step_size) N(0, I), the noise unscaled
    beta, step = 0.3, 0.05
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    noise = torch.randn(THETA.shape, generator=g2, dtype=THETA.dtype)
    expected = svgd_gradient(THETA, GRAD, 0.5) + beta * GRAD - math.sqrt(2 * beta / step) * noise
    torch.testing.assert_close(spos_gradient(THETA, GRAD, 0.5, beta, step, g1), expected)
    # beta = 0: no Langevin term, SVGD exactly
    torch.testing.assert_close(spos_gradient(THETA, GRAD, 0.5, 0.0, step), svgd_gradient(THETA, GRAD, 0.5))


def test_spos_noise_scaled_by_the_median_gradient_is_an_option():
    # the published PyTorch code's variant: the noise times median|g|, torch.median's lower middle
    # value (|GRAD| sorted: 0.25 0.5 0.75 1 1.5 2 -> 0.75), as before this option existed
    beta, step = 0.3, 0.05
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    noise = torch.randn(THETA.shape, generator=g2, dtype=THETA.dtype)
    expected = (svgd_gradient(THETA, GRAD, 0.5) + beta * GRAD
                - math.sqrt(2 * beta / step) * 0.75 * noise)
    got = spos_gradient(THETA, GRAD, 0.5, beta, step, g1, noise="grad_median")
    torch.testing.assert_close(got, expected)
    assert RepulsiveAttention(method="spos").spos_noise == "paper"
    with pytest.raises(ConfigError, match="spos_noise"):
        RepulsiveAttention(method="spos", spos_noise="median")


def test_the_particle_of_head_h_is_the_rows_that_produce_head_h():
    torch.manual_seed(0)
    e, h = 8, 2
    d = e // h
    m = MultiHeadAttention(e, h)
    w = m.q_proj.weight
    for head in range(h):
        assert torch.equal(head_rows(w, h)[head], w[head * d : (head + 1) * d].flatten())
    # and those rows are what head h's attention depends on: zero head 1's query rows ...
    x = torch.randn(2, 5, e)
    with record_attention([m], first_only=False) as rec:
        m(x)
        with torch.no_grad():
            m.q_proj.weight[d:] = 0
            m.q_proj.bias[d:] = 0
        m(x)
    before, after = (r.weights for r in rec.records["0"])
    torch.testing.assert_close(after[:, 0], before[:, 0])  # head 0 untouched
    torch.testing.assert_close(after[:, 1], torch.full_like(after[:, 1], 1 / 5))  # head 1 uniform


@pytest.mark.parametrize("grouping", ["joint", "per_projection"])
def test_the_callback_writes_each_heads_direction_into_its_rows(grouping):
    torch.manual_seed(0)
    e, h = 12, 3
    d = e // h
    m = MultiHeadAttention(e, h)
    m(torch.randn(2, 4, e)).square().sum().backward()
    grads = {n: getattr(m, f"{n}_proj").weight.grad.clone() for n in "qkv"}
    biases = {n: getattr(m, f"{n}_proj").bias.grad.clone() for n in "qkv"}
    rule = RepulsiveAttention(step_size=0.1, alpha=0.5, grouping=grouping)
    rule.apply(m)

    def rows(t, head):
        return t[head * d : (head + 1) * d].flatten()

    def particles(tensors):
        return torch.stack([torch.cat([rows(t, hd) for t in tensors]) for hd in range(h)])

    sets = [list("qkv")] if grouping == "joint" else [["q"], ["k"], ["v"]]
    for names in sets:
        theta = particles([getattr(m, f"{n}_proj").weight.detach() for n in names])
        want = 0.1 * svgd_gradient(theta, particles([grads[n] for n in names]), 0.5)
        got = particles([getattr(m, f"{n}_proj").weight.grad for n in names])
        torch.testing.assert_close(got, want)
    for n in "qkv":  # biases are not particles unless include_bias=true
        assert torch.equal(getattr(m, f"{n}_proj").bias.grad, biases[n])


def test_modules_without_values_or_with_one_head():
    fusion = nn.ModuleList([MultiHeadAttention(8, 2, project_values=False),
                            MultiHeadAttention(8, 1, project_values=False)])
    groups = RepulsiveAttention().groups(fusion)
    assert len(groups) == 1  # the single-head module has nothing to repel
    (_, module, [params]) = groups[0]
    assert params == [module.q_proj.weight, module.k_proj.weight]
    assert len(RepulsiveAttention(include_bias=True).groups(fusion)[0][2][0]) == 4


def test_stacks_and_layers_select_modules():
    class Seq2Seq(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = nn.ModuleList(TransformerEncoderLayer(8, 2, 16) for _ in range(3))
            self.dec = nn.ModuleList(TransformerDecoderLayer(8, 2, 16) for _ in range(2))

    model = Seq2Seq()
    names = lambda **kw: [n for n, _ in select_modules(model, **kw)]
    assert names(stacks=["encoder"], layers="all") == [f"enc.{i}.self_attn" for i in range(3)]
    assert names(stacks=["decoder", "cross"], layers="last") == ["dec.1.self_attn", "dec.1.cross_attn"]
    assert names(stacks=["encoder"], layers="first") == ["enc.0.self_attn"]
    assert names(stacks=["cross"], layers=[0]) == ["dec.0.cross_attn"]
    with pytest.raises(ConfigError, match="stacks"):
        RepulsiveAttention(stacks=["decoders"])
    with pytest.raises(ConfigError, match="method"):
        RepulsiveAttention(method="sgld")


def test_disagreement_of_identical_and_orthogonal_heads():
    same = torch.ones(2, 3, 4, 5)  # (B, S, H, d): all heads equal
    assert disagreement(same).item() == pytest.approx(1.0)
    ortho = torch.zeros(1, 2, 2, 4)
    ortho[..., 0, 0] = 1.0
    ortho[..., 1, 1] = 2.0
    assert disagreement(ortho).item() == pytest.approx(0.5)  # only the diagonal of cos counts
    padded = torch.cat([ortho, torch.zeros(1, 3, 2, 4)], dim=1)  # zero rows (padded queries) left out
    assert disagreement(padded).item() == pytest.approx(0.5)


class TinyModule(TaskModule):
    def __init__(self):
        torch.manual_seed(0)
        super().__init__(nn.ModuleDict({"attn": MultiHeadAttention(8, 2), "head": nn.Linear(8, 1)}),
                         optimizer=functools.partial(torch.optim.SGD, lr=1.0))
        self.x = torch.randn(4, 5, 8)

    @property
    def attn(self) -> MultiHeadAttention:
        return self.net["attn"]

    def task_loss(self, batch, batch_idx):
        return self.net["head"](self.attn(self.x)).square().mean()

    def train_dataloader(self):
        return [0, 1]


class Spy(pl.Callback):
    def __init__(self):
        self.grads, self.params, self.losses = [], [], []

    def on_before_backward(self, trainer, pl_module, loss):
        self.losses.append(loss.detach().clone())

    def on_after_backward(self, trainer, pl_module):
        self.grads.append(pl_module.attn.q_proj.weight.grad.clone())
        self.params.append(pl_module.attn.q_proj.weight.detach().clone())


def fit(module, *callbacks, steps=1):
    trainer = pl.Trainer(max_steps=steps, logger=False, enable_checkpointing=False, callbacks=list(callbacks),
                         enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    trainer.fit(module)
    return trainer


def test_the_optimizer_steps_along_the_svgd_direction():
    module, spy = TinyModule(), Spy()
    rule = RepulsiveAttention(step_size=0.1, alpha=1.0, projections=["q"])
    fit(module, spy, rule)
    theta = head_rows(spy.params[0], 2)
    want = 0.1 * svgd_gradient(theta, head_rows(spy.grads[0], 2), 1.0)
    moved = head_rows(spy.params[0] - module.attn.q_proj.weight.detach(), 2)  # SGD lr=1: grad
    torch.testing.assert_close(moved, want, atol=1e-6, rtol=1e-5)


def test_mar_adds_the_disagreement_to_the_loss():
    module, spy = TinyModule(), Spy()
    plain = TinyModule().training_step(None, 0).detach()
    with torch.no_grad():
        merged = []
        hook = module.attn.out_proj.register_forward_pre_hook(lambda _m, args: merged.append(args[0]))
        module.attn(module.x)
        hook.remove()
        penalty = disagreement(merged[0].view(4, 5, 2, 4))
    fit(module, spy, DisagreementRegularizer(weight=0.5))
    torch.testing.assert_close(spy.losses[0], plain + 0.5 * penalty)
    assert "training_step" not in module.__dict__  # the module's own method, never replaced
    assert not module._loss_terms  # the term is registered for the fit only


class PlainModule(pl.LightningModule):
    """A task module that is not a TaskModule: it has no loss terms to add to."""

    def __init__(self):
        super().__init__()
        self.attn = MultiHeadAttention(8, 2)

    def training_step(self, batch, batch_idx):
        return self.attn(torch.randn(1, 3, 8)).sum()

    def train_dataloader(self):
        return [0]

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1.0)


def test_mar_on_a_module_without_loss_terms_is_a_config_error():
    with pytest.raises(ConfigError, match="PlainModule is not a TaskModule"):
        fit(PlainModule(), DisagreementRegularizer(weight=0.5))

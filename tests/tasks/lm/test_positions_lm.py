"""Task lm's `task.module.net.positions`: every causal scheme of the registry trains a step with
every position option, KV-cached decoding equals the full pass for each, learned positions
asked past their table are refused in one line (the others extrapolate), compile=true with
rope and alibi, and one CLI run."""

import pytest
import torch
from helpers.cards import TINY
from helpers.cli import QUIET, metrics_files, run_here

from attnlab.attention.schemes.tables import fitting
from attnlab.errors import ConfigError
from tasks.lm.embeddings import sinusoidal_positions
from tasks.lm.model import POSITIONS, TransformerLM

V, BLOCK = 40, 8
# every causal scheme (a new one is covered without an edit), and the output gate on one
CAUSAL = [{"scheme": name} for name in fitting(causal=True)] + [{"scheme": "unas", "gate": "headwise"}]


def tiny_lm(attention, positions: str, **kwargs) -> TransformerLM:
    torch.manual_seed(0)
    sizes = {"d_model": 16, "nhead": 2, "num_layers": 2, "dim_feedforward": 32, "dropout": 0.0}
    return TransformerLM(V, 0, attention=attention, positions=positions, block_size=BLOCK,
                         adaptive_cutoffs=None, **{**sizes, **kwargs})


@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("attention", CAUSAL, ids=lambda a: "+".join(map(str, a.values())))
def test_every_causal_scheme_trains_a_step_with_every_position_option(attention, positions):
    model = tiny_lm(attention, positions)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.randint(2, V, (2, BLOCK + 1))
    loss = model.nll(model(ids[:, :-1]), ids[:, 1:]).mean()
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    optimizer.step()
    # the attention's projections learn (the positions reach them without breaking the graph)
    q_proj = model.layers[0].self_attn.q_proj.weight
    assert not torch.equal(q_proj, before[[id(p) for p in model.parameters()].index(id(q_proj))])


@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("scheme", ["unas", "coda", "stickbreaking"])
def test_decoding_with_the_cache_equals_the_full_pass_for_every_position_option(scheme, positions):
    """unas: the key/value cache; coda: its rows of logits carried too; stick-breaking: the
    prefix re-run. Past the training block too (a learned table is made to cover it)."""
    model = tiny_lm({"scheme": scheme}, positions, max_positions=2 * BLOCK).eval()
    ids = torch.randint(2, V, (2, 2 * BLOCK))
    with torch.no_grad():
        full = model(ids)
        cache = model.start_decoding()
        steps = torch.stack([model.decode_step(ids[:, t], cache) for t in range(ids.shape[1])], dim=1)
    torch.testing.assert_close(steps, full, rtol=0, atol=1e-5)


def test_learned_positions_are_refused_past_their_table_and_the_others_extrapolate():
    learned = tiny_lm({"scheme": "unas"}, "learned")
    with pytest.raises(ConfigError) as refused:
        learned.check_length(8 * BLOCK, "task.eval_lengths=[8]")
    message = str(refused.value)
    assert "\n" not in message and message.startswith("task.eval_lengths=[8] asks for 64 positions")
    assert "learned positions do not extrapolate" in message and "none|sinusoidal|rope|alibi" in message
    assert "lengths <= 1" in message
    learned.check_length(BLOCK, "task.eval_lengths=[1]")  # within the table: nothing to say
    with pytest.raises(ConfigError, match="positions=learned has a table of 8"):
        learned(torch.randint(2, V, (1, BLOCK + 1)))
    ids = torch.randint(2, V, (1, 8 * BLOCK))
    for positions in ("sinusoidal", "none", "rope", "alibi"):
        model = tiny_lm({"scheme": "unas"}, positions)
        model.check_length(8 * BLOCK, "task.eval_lengths=[8]")
        assert torch.isfinite(model(ids)).all()
    # sinusoids past the table are the same function of the position
    sinusoidal = tiny_lm({"scheme": "unas"}, "sinusoidal")
    torch.testing.assert_close(sinusoidal._positions(0, 3 * BLOCK), sinusoidal_positions(3 * BLOCK, 16))
    assert sinusoidal._positions(0, BLOCK).shape == (BLOCK, 16)


@pytest.mark.slow  # torch.compile: ~a minute on 2 busy cores
@pytest.mark.parametrize("positions", ["rope", "alibi"])
def test_compile_true_with_rope_and_alibi(positions):
    """As compile=true compiles the network (attnlab.compiling: dynamic shapes, inductor): the
    compiled forward and backward equal the eager ones, at two lengths without a recompile error."""
    model = tiny_lm({"scheme": "unas"}, positions)
    compiled = tiny_lm({"scheme": "unas"}, positions)
    compiled.compile(dynamic=True, backend="inductor")
    for length in (BLOCK, 2 * BLOCK):
        ids = torch.randint(2, V, (2, length))
        eager_out, compiled_out = model(ids), compiled(ids)
        torch.testing.assert_close(compiled_out, eager_out, rtol=1e-4, atol=1e-5)
        eager_out.sum().backward()
        compiled_out.sum().backward()
    grads = [(p.grad, q.grad) for p, q in zip(model.parameters(), compiled.parameters()) if p.grad is not None]
    assert all(torch.allclose(a, b, rtol=1e-3, atol=1e-5) for a, b in grads)


@pytest.mark.slow  # ~15 s in this process
def test_train_stickbreaking_without_positions_through_the_cli(tmp_path, data_dir):
    run_here(["task=lm", "model=stickbreaking", "task.module.net.positions=none", *TINY["lm"], *QUIET],
             tmp_path, data_dir)
    [metrics] = metrics_files(tmp_path / "outputs")
    assert metrics["status"] == "ok" and metrics["metrics"]["test/tokens"] > 0
    assert 0 < metrics["metrics"]["test/loss"] < 10

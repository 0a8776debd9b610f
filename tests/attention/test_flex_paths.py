"""The FlexAttention paths (kernels/flex.py) and the CUDA dispatcher between Triton and Flex
(paths.py): forward against the float64 reference on the CPU (eager FlexAttention: forward only),
padding with fully padded rows, sliding-window and document masks, the padding BlockMask against
FlexAttention's own builder, which path serves which call, the measured choice table; on a GPU
(`gpu` marker, skipped without CUDA) compiled forward and backward against the reference."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.kernel_cases import leaf, out_and_grads, padded_problem, reference_out
from torch import nn

from attnlab.attention import attend, cuda_table, paths
from attnlab.attention.functional import candidates, normalizer, route
from attnlab.attention.kernels import flex, triton_ops, triton_query_normalized
from attnlab.attention.reference import masked_logits
from attnlab.attention.schemes import dnas, sigmoid
from attnlab.errors import ConfigError

F32, BF16 = torch.float32, torch.bfloat16
SCHEMES = [("dnas", 1), ("hnas", 1), ("sinkhorn", 3)]
SHAPES = [(6, 5, 8, None), (130, 200, 16, 8), (1, 1, 8, None)]
pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: faster on a shared machine
no_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _flex_out(q, k, v, scheme, kpm, qpm, u, n_iter, **kw):
    u = u if scheme == "hnas" else None
    return flex.query_normalized_attend_flex(q, k, v, u, kpm, qpm, n_iter=n_iter, **kw)


@pytest.mark.parametrize(("scheme", "n_iter"), SCHEMES)
@pytest.mark.parametrize(("S_q", "S_k", "d", "d_v"), SHAPES)
def test_flex_forward_matches_the_reference(scheme, n_iter, S_q, S_k, d, d_v):
    """Items of padded_problem: partial key and query padding, none, every key padded, every
    query padded; H = 2 heads with their own u; lengths across FlexAttention's 128-blocks."""
    q, k, v, _, kpm, qpm = padded_problem(S_q, S_k, d, d_v=d_v, H=2, seed=S_q + S_k)
    u = torch.tensor([0.2, 0.9]).view(1, 2, 1, 1)
    out = _flex_out(q, k, v, scheme, kpm, qpm, u, n_iter)
    ref = reference_out(q, k, v, scheme, kpm, qpm, u, n_iter=n_iter)
    torch.testing.assert_close(out.double(), ref, atol=2e-6, rtol=0)
    assert out.dtype == F32 and torch.isfinite(out).all()
    # padded queries and queries without a key give exact zeros, as the reference does
    assert (out[2] == 0).all() and (out[3] == 0).all() and (out[0][:, qpm[0]] == 0).all()


def test_flex_without_masks_matches_the_reference():
    q, k, v, u, _, _ = padded_problem(70, 90, 16, B=2, seed=4)
    for scheme, n_iter in SCHEMES:
        out = _flex_out(q, k, v, scheme, None, None, u, n_iter)
        ref = reference_out(q, k, v, scheme, None, None, u, n_iter=n_iter)
        torch.testing.assert_close(out.double(), ref, atol=2e-6, rtol=0)


def _masked_reference(q, k, v, scheme, kpm, qpm, u, n_iter, keep):
    """The scheme's reference weights on logits that are also -inf where `keep` (B, S_q, S_k)
    is False, in float64."""
    q, k, v = (t.double() for t in (q, k, v))
    logits = masked_logits(q, k, kpm, qpm).masked_fill(~keep[:, None], float("-inf"))
    norm, inputs = normalizer(scheme, n_iter=n_iter, u=u.double() if scheme == "hnas" else None)
    return norm.weights(logits, **inputs) @ v


@pytest.mark.parametrize(("scheme", "n_iter", "mask"), [("dnas", 1, "window"), ("hnas", 1, "document"),
                                                     ("sinkhorn", 3, "document")])
def test_sliding_window_and_document_masks_match_the_reference(scheme, n_iter, mask):
    """A mask_mod and-ed with the padding (HNAS's UNAS half shares DNAS's row mask)."""
    S = 140
    q, k, v, u, kpm, qpm = padded_problem(S, S, 16, H=2, seed=5)
    if mask == "window":
        pos = torch.arange(S)
        keep = ((pos[:, None] - pos[None, :]).abs() <= 20).expand(4, S, S)
        mask_mod = flex.sliding_window(20)
    else:
        doc_ids = torch.cumsum(torch.rand(4, S, generator=torch.Generator().manual_seed(6)) < 0.05, 1)
        keep = doc_ids[:, :, None] == doc_ids[:, None, :]
        mask_mod = flex.document(doc_ids)
    out = _flex_out(q, k, v, scheme, kpm, qpm, u, n_iter, mask_mod=mask_mod)
    ref = _masked_reference(q, k, v, scheme, kpm, qpm, u, n_iter, keep)
    torch.testing.assert_close(out.double(), ref, atol=2e-6, rtol=0)


@pytest.mark.parametrize(("n_rows", "n_cols"), [(300, 130), (128, 256), (5, 7)])
def test_padding_block_mask_equals_flex_attentions_own(n_rows, n_cols):
    """The block-level construction (never S_q x S_k) gives FlexAttention's dense-built mask:
    the same partial and full blocks, and the same kept pairs."""
    from torch.nn.attention.flex_attention import create_block_mask

    _, _, _, _, kpm, qpm = padded_problem(n_rows, n_cols, 4, seed=7)
    qpm[1, : n_rows // 2] = True  # a run of padded queries: whole empty blocks
    ours = flex.block_masks(4, n_rows, n_cols, "cpu", kpm, qpm).rows

    def padding(b, h, i, j):
        return ~qpm[b, i] & ~kpm[b, j]

    theirs = create_block_mask(padding, 4, None, n_rows, n_cols, device="cpu")
    for name in ("kv_num_blocks", "full_kv_num_blocks"):
        assert torch.equal(getattr(ours, name), getattr(theirs, name)), name
    assert torch.equal(ours.to_dense(), theirs.to_dense())


@pytest.fixture
def compiled_on_cpu(monkeypatch):
    """CPU tensors through flex._flex's compiled branch (the CUDA one), built as on CUDA but with
    the aot_eager backend (compiled CPU FlexAttention has no LSE); returns the number of graphs
    compiled so far in each set, {lse_only: count}."""
    from torch._dynamo.backends.registry import lookup_backend

    torch._dynamo.reset()
    flex._compiled.cache_clear()
    flex.log_recompile_limit_once.cache_clear()
    graphs = {False: 0, True: 0}

    def counting(lse_only):
        def backend(gm, inputs):
            graphs[lse_only] += 1
            return lookup_backend("aot_eager")(gm, inputs)

        return backend

    compiled = {lse_only: flex._compiled(lse_only, counting(lse_only)) for lse_only in graphs}
    monkeypatch.setattr(flex, "_compiled", compiled.get)
    monkeypatch.setattr(flex, "_runs_compiled", lambda t: True)
    yield lambda: dict(graphs)
    torch._dynamo.reset()


def _train_and_validate(epochs: int):
    """HNAS through two layers sharing their block masks, as an epoch of training (grad on) at
    one length and validation (no_grad) at three others, with other batch sizes, d != d_v."""
    for epoch in range(epochs):
        for S, B, train in ((40, 4, True), (200, 3, False), (300, 2, False), (390, 3, False)):
            q, k, v, u, kpm, qpm = padded_problem(S, S, 32, d_v=24, B=B, H=2, seed=epoch)
            kpm, qpm = kpm[:B], qpm[:B]
            masks = flex.block_masks(B, S, S, "cpu", kpm, qpm)
            with torch.set_grad_enabled(train):
                for _layer in range(2):
                    out = flex.query_normalized_attend_flex(q, k, v, u, kpm, qpm, masks=masks)
    return out, reference_out(q, k, v, "hnas", kpm, qpm, u)


def test_train_and_validation_at_new_lengths_compile_once(compiled_on_cpu, caplog):
    """Finding 4: alternating training and validation at other lengths recompiled, in one set
    of graphs, per length (until dims went dynamic), per grad mode and per value width, until
    torch's limit (8), then ran unfused. Lengths and batch sizes are symbolic from the first
    call, and the LSE passes and the output passes each have their own set: each compiles one
    graph for training and one for validation (three lengths), all in the first epoch, none in
    the next two, and no 'recompile limit' warning."""
    _train_and_validate(epochs=1)
    first = compiled_on_cpu()  # backend calls: one a graph, and a retrace of the first LSE pass
    assert first[False] == 2 and first[True] <= 3, first
    out, ref = _train_and_validate(epochs=2)
    assert compiled_on_cpu() == first
    assert "recompile limit" not in caplog.text
    torch.testing.assert_close(out.double(), ref, atol=2e-6, rtol=0)


def test_the_recompile_limit_is_logged_once_and_the_output_stays_right(compiled_on_cpu, caplog):
    """Past the limit FlexAttention runs unfused (still exact): said once, not silently."""
    with torch._dynamo.config.patch(recompile_limit=1):
        out, ref = _train_and_validate(epochs=2)
    assert caplog.text.count("FlexAttention reached torch's recompile limit") == 1
    torch.testing.assert_close(out.double(), ref, atol=2e-6, rtol=0)


def test_every_pass_compiles_to_one_graph(compiled_on_cpu):
    """All 2k + 1 calls of HNAS / Sinkhorn share one form (score_mod, block mask, LSE): one
    torch.compile graph for a shape in each of the two sets (LSE-only passes, output passes),
    none more on the next call with new values. (Traced by Dynamo on the CPU with the
    aot_eager backend: compiled CPU FlexAttention has no LSE.)"""
    for seed in (1, 2):
        q, k, v, u, kpm, qpm = padded_problem(40, 40, 16, H=2, seed=seed)
        for scheme, n_iter in SCHEMES:
            out = _flex_out(q, k, v, scheme, kpm, qpm, u, n_iter)
            torch.testing.assert_close(out.double(), reference_out(q, k, v, scheme, kpm, qpm, u,
                                                                   n_iter=n_iter),
                                       atol=2e-6, rtol=0)
    assert compiled_on_cpu()[False] == 1


# ----------------------------------------------------------------------------- the dispatcher
@pytest.fixture
def as_cuda(monkeypatch):
    """CPU tensors routed as CUDA ones, Triton 'available'; records which kernel ran (Triton's
    stand-in returns zeros: it only has to be chosen here, test_triton_kernels checks it)."""
    ran = []
    monkeypatch.setattr(paths, "device_type", lambda t: "cuda")
    monkeypatch.setattr(triton_query_normalized, "available", lambda device: device == "cuda")
    real_flex = flex.query_normalized_attend_flex

    def triton(q, k, v, *args, **kwargs):
        ran.append("triton")
        return torch.zeros(*q.shape[:3], v.shape[-1], dtype=q.dtype)

    def flex_spy(*args, **kwargs):
        ran.append("flex")
        return real_flex(*args, **kwargs)

    monkeypatch.setattr(triton_ops, "query_normalized_attend_triton", triton)
    monkeypatch.setattr(flex, "query_normalized_attend_flex", flex_spy)
    return ran


@pytest.fixture
def choices(monkeypatch, tmp_path):
    """Points the dispatcher at a choice table of the test's own; returns a writer."""
    file = tmp_path / "cuda_choices.json"
    monkeypatch.setattr(cuda_table, "CUDA_CHOICES_FILE", file)
    cuda_table.cuda_choices.cache_clear()

    def write(table: dict | str):
        file.write_text(table if isinstance(table, str) else json.dumps({"choices": table}))
        cuda_table.cuda_choices.cache_clear()

    yield write
    cuda_table.cuda_choices.cache_clear()


def test_route_lists_flex_on_cuda_only_without_dropout(as_cuda):
    for scheme in ("dnas", "hnas"):
        assert candidates(scheme, "cuda", BF16, u=0.5) == ["triton", "flex", "reference"]
        assert candidates(scheme, "cuda", BF16, 0.1, u=0.5) == ["triton", "reference"]
    # (the CPU keeps its kernels: eager FlexAttention is slower there and has no backward)
    assert not dnas.FLEX.supports(None, "cpu", F32, 0.0, False)
    assert candidates("sinkhorn", "cuda", F32, n_iter=4) == ["flex", "reference"]
    assert candidates("sinkhorn", "cuda", F32, n_iter=1) == candidates("dnas", "cuda", F32)
    assert candidates("hnas", "cuda", torch.float64) == ["reference"]
    assert candidates("entmax", "cuda", BF16) == ["reference"]


@pytest.mark.parametrize(("table", "dropout_p", "expected"), [
    ({}, 0.0, "triton"),  # never measured: Triton
    ({"1024/16/float32": "flex"}, 0.0, "flex"),
    ({"1024/16/float32": "flex"}, 0.1, "triton"),  # Flex has no dropout
    ({"1024/16/float32": "triton"}, 0.0, "triton"),
    ({"2048/16/float32": "flex"}, 0.0, "triton"),  # another length bucket
])
def test_attend_on_cuda_runs_the_measured_choice(table, dropout_p, expected, as_cuda, choices):
    choices(table)
    q, k, v, u, kpm, qpm = padded_problem(40, 30, 16, B=2, seed=8)
    for scheme in ("dnas", "hnas"):
        out = attend(q, k, v, scheme, kpm, qpm, dropout_p=dropout_p, u=u)
        if expected == "flex":
            torch.testing.assert_close(out.double(), reference_out(q, k, v, scheme, kpm, qpm, u),
                                       atol=2e-6, rtol=0)
    assert as_cuda == [expected, expected]


@pytest.mark.parametrize(("S_q", "S_k"), [(1500, 30), (30, 1500)])
def test_the_choice_is_read_at_the_longer_side(S_q, S_k, as_cuda, choices):
    """The table's length is max(S_q, S_k), whichever side is the long one."""
    choices({"2048/16/float32": "flex"})
    q, k, v, _, kpm, qpm = padded_problem(S_q, S_k, 16, B=1, H=2, seed=8)
    attend(q, k, v, "dnas", kpm, qpm)
    assert as_cuda == ["flex"]


def test_dropout_of_one_declines_every_cuda_kernel(as_cuda):
    """p = 1 drops every weight: the reference gives zeros (the kernels' 1 / (1 - p) would not)."""
    for scheme in ("dnas", "hnas"):
        assert candidates(scheme, "cuda", BF16, 0.99, u=0.5) == ["triton", "reference"]
        assert candidates(scheme, "cuda", BF16, 1.0, u=0.5) == ["reference"]


def test_unas_dropout_reaches_sdpa_on_cuda(as_cuda, monkeypatch):
    from attnlab.attention.kernels import sdpa

    seen = []
    real = sdpa.unas_sdpa
    monkeypatch.setattr(sdpa, "unas_sdpa", lambda *a: seen.append(a[-2:]) or real(*a))
    q, k, v, _, _, _ = padded_problem(6, 5, 8, B=1, seed=2)
    assert candidates("unas", "cuda", BF16, 0.25)[0] == "sdpa"
    attend(q.to(BF16), k.to(BF16), v.to(BF16), "unas", dropout_p=0.25)
    assert seen == [(False, 0.25)]  # (causal, dropout_p)


def test_sinkhorn_rounds_run_on_flex_on_cuda(as_cuda):
    q, k, v, _, kpm, qpm = padded_problem(20, 24, 16, B=4, seed=9)
    out = attend(q, k, v, "sinkhorn", kpm, qpm, n_iter=4)
    assert as_cuda == ["flex"]
    torch.testing.assert_close(out.double(), reference_out(q, k, v, "sinkhorn", kpm, qpm, n_iter=4),
                               atol=2e-6, rtol=0)


def test_flex_declines_head_dims_past_its_limit(as_cuda, caplog):
    """Past 256 (VQA's fusion over 2,048-d detector features): the reference, logged once."""
    d = flex.MAX_HEAD_DIM + 4
    q, k, v, _, _, _ = padded_problem(3, 4, d, B=1, seed=11)
    norm, _ = normalizer("sinkhorn", n_iter=2)
    call = norm.call(q, k, v)
    flex.log_decline_once.cache_clear()  # logged once per process: another test may have already
    with caplog.at_level("WARNING"):
        assert not dnas.FLEX.accepts(norm, call) and route(q, k, v, "sinkhorn", n_iter=2) == "reference"
        assert not dnas.FLEX.accepts(norm, call)
    assert as_cuda == [] and [r.message for r in caplog.records].count(
        f"head dims d={d}, d_v={d} are outside the FlexAttention paths' "
        f"16..{flex.MAX_HEAD_DIM}: the materialized reference runs instead") == 1


def test_row_wise_flex_declines_head_dims_past_its_limit_with_the_reason(as_cuda, caplog):
    d = flex.MAX_HEAD_DIM + 4
    q, k, v, _, _, _ = padded_problem(3, 4, d, B=1, seed=11)
    norm, inputs = normalizer("sigmoid")
    flex.log_decline_once.cache_clear()
    with caplog.at_level("WARNING"):
        assert not sigmoid.PATHS[-1].accepts(norm, norm.call(q, k, v, **inputs))
    declined = [r.message for r in caplog.records if r.name == flex.__name__]
    assert declined == [(f"head dims d={d}, d_v={d} are outside the FlexAttention paths' "
                         f"16..{flex.MAX_HEAD_DIM}: the materialized reference runs instead")]


def test_attention_dropout_reaches_the_triton_kernels(as_cuda, monkeypatch):
    seen = []
    monkeypatch.setattr(triton_ops, "query_normalized_attend_triton",
                        lambda q, k, v, *a, **kw: seen.append(kw) or torch.zeros_like(q))
    q, k, v, u, kpm, qpm = padded_problem(6, 5, 16, B=1, seed=3)
    attend(q, k, v, "hnas", kpm, qpm, dropout_p=0.2, u=u)
    assert seen == [{"dropout_p": 0.2}]


def test_stick_breaking_blocks_run_on_the_cpu_and_cuda_only():
    assert candidates("stickbreaking", "cuda", BF16, causal=True)[0] == "blocked"
    for device in ("mps", "xpu"):
        assert candidates("stickbreaking", device, BF16, causal=True) == ["reference"]


@pytest.mark.parametrize("chosen", ["flex", "triton"])
def test_the_cuda_dispatch_breaks_no_graph_with_dynamic_lengths(chosen, monkeypatch, choices):
    """Finding 7: with dynamic shapes the length reached `preferred_cuda_path` (an
    assume_constant_result) as a SymInt, which broke the graph at every attention call. The
    dispatch now passes plain values (the length's bucket, the table's head dim): a compiled
    DNAS attention (dynamic=True; CPU tensors routed as CUDA ones, Triton's stand-in returns
    zeros) over three lengths compiles one graph, breaks none, and runs the measured choice."""
    from torch._dynamo.utils import counters

    monkeypatch.setattr(paths, "device_type", lambda t: "cuda")
    monkeypatch.setattr(triton_query_normalized, "available", lambda device: device == "cuda")
    monkeypatch.setattr(triton_ops, "query_normalized_attend_triton",
                        lambda q, k, v, *args, **kwargs: torch.zeros_like(q))
    choices({"1024/16/float32": chosen, "1024/32/float32": "triton" if chosen == "flex" else "flex"})
    norm, _ = normalizer("dnas")
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(lambda q, k, v: norm.attend(q, k, v), backend="eager", dynamic=True)
    for S in (9, 12, 20):
        q, k, v, *_ = padded_problem(S, S, 16, H=2, seed=S)
        out = compiled(q, k, v)
        expected = (reference_out(q, k, v, "dnas", None, None, None) if chosen == "flex"
                    else torch.zeros_like(out))
        torch.testing.assert_close(out.double(), expected.double(), atol=2e-6, rtol=0)
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 1
    torch._dynamo.reset()


def test_choice_keys_and_a_broken_table(choices):
    assert [cuda_table.length_bucket(s) for s in (1, 1024, 1025, 5000, 16384, 50000)] == \
        [1024, 1024, 2048, 8192, 16384, 16384]
    assert cuda_table.choice_key(3000, 64, BF16) == "4096/64/bfloat16"
    choices({"4096/64/bfloat16": "flex", "8192/64/bfloat16": "cudnn"})  # unknown names: ignored
    assert cuda_table.preferred_cuda_path(3000, 64, BF16) == "flex"
    assert cuda_table.preferred_cuda_path(8000, 64, BF16) == cuda_table.DEFAULT_CUDA_PATH == "triton"
    choices("{not json")
    with pytest.raises(ConfigError, match="--write-choices"):
        cuda_table.preferred_cuda_path(3000, 64, BF16)


# ----------------------------------------------------------------------------- on a GPU
@pytest.mark.parametrize("dtype", [BF16, F32], ids=["bf16", "fp32"])  # gpu-check: "not fp32"
@pytest.mark.parametrize(("scheme", "n_iter"), SCHEMES)
@pytest.mark.parametrize(("S", "d", "d_v"), [(17, 64, 64), (1000, 52, 32), (1024, 128, 128)])
@pytest.mark.gpu
@no_cuda
def test_compiled_flex_forward_and_backward_on_a_gpu(scheme, n_iter, S, d, d_v, dtype):
    """Outputs and dq/dk/dv/du of the compiled kernels against float64, within a few times
    SDPA's own error in the same dtype (UNAS, against its float64 reference)."""
    q, k, v, u, kpm, qpm = padded_problem(S, S, d, d_v=d_v, H=2, seed=S)
    g_out = torch.randn(4, 2, S, d_v, generator=torch.Generator().manual_seed(1))
    kpm, qpm, g_out = kpm.cuda(), qpm.cuda(), g_out.cuda()
    inputs = leaf(*(t.cuda() for t in (q, k, v, u)), dtype=dtype)
    hnas_u = inputs[3] if scheme == "hnas" else None
    got = out_and_grads(lambda: flex.query_normalized_attend_flex(
        *inputs[:3], hnas_u, kpm, qpm, n_iter=n_iter), inputs[:3 + (hnas_u is not None)], g_out)
    ref_in = leaf(*inputs, dtype=torch.float64)
    ref = out_and_grads(lambda: reference_out(*ref_in[:3], scheme, kpm, qpm, ref_in[3],
                                              n_iter=n_iter), ref_in[:3 + (hnas_u is not None)],
                        g_out)
    sdpa_err = _sdpa_error(inputs[:3], dtype)
    for name, a, b in zip(("out", "dq", "dk", "dv", "du"), got, ref):
        err = (a.double() - b).abs().max().item()
        assert err <= 16 * sdpa_err * max(1.0, b.abs().max().item()), (name, err, sdpa_err)


def _sdpa_error(inputs, dtype) -> float:
    """SDPA's largest output error in `dtype` against float64 on these inputs: the yardstick."""
    q, k, v = (t.detach() for t in inputs)
    got = torch.nn.functional.scaled_dot_product_attention(q, k, v).double()
    ref = torch.softmax(q.double() @ k.double().transpose(-2, -1) / q.shape[-1] ** 0.5, -1)
    return max((got - ref @ v.double()).abs().max().item(), torch.finfo(dtype).eps)


@pytest.mark.gpu
@no_cuda
def test_attend_on_a_gpu_runs_compiled_flex_when_chosen(as_cuda, choices):
    choices({cuda_table.choice_key(256, 64, BF16): "flex"})
    q, k, v = (torch.randn(2, 4, 256, 64, device="cuda", dtype=BF16) for _ in range(3))
    out = attend(q, k, v, "dnas")
    assert as_cuda == ["flex"] and flex._compiled.cache_info().currsize == 1
    ref = reference_out(q, k, v, "dnas", None, None).to(out.device)
    assert (out.double() - ref).abs().max() < 3e-2


# ----------------------------------------------------------------------------- the CUDA bench
@pytest.fixture(scope="module")
def bench():
    """bench/attention_cuda.py as a module (bench/ is scripts, not a package)."""
    import importlib.util
    from pathlib import Path

    file = Path(__file__).resolve().parents[2] / "bench" / "attention_cuda.py"
    spec = importlib.util.spec_from_file_location("attention_cuda", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cuda_bench_says_in_one_line_that_it_needs_cuda(bench, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        bench.main(["--device", "cuda", "--seq", "1024", "--threads", "2"])


def test_the_cuda_bench_runs_the_named_kernel_or_stops(bench, monkeypatch):
    """A method calls its path itself (pinned over the table): Flex serves even where the
    table says Triton, and a declining path is an error, never a timed reference."""
    monkeypatch.setattr(paths, "device_type", lambda t: "cuda")
    monkeypatch.setattr(triton_query_normalized, "available", lambda device: False)
    q, k, v, u, _, _ = padded_problem(20, 20, 16, B=2, seed=10)
    out = bench._method("hnas_flex", F32)(q, k, v, u)
    torch.testing.assert_close(out.double(), reference_out(q, k, v, "hnas", None, None, u),
                               atol=2e-6, rtol=0)
    with pytest.raises(RuntimeError, match="triton path declined dnas"):
        bench._method("dnas_triton", F32)(q, k, v, u)


def test_the_cuda_bench_writes_the_faster_kernel_per_shape(bench, monkeypatch, tmp_path):
    def timing(seconds):
        return {"fwd": seconds / 3, "fwdbwd": seconds, "peak_gib": 1.0}

    results = {("bf16", 1024, "dnas_triton"): timing(1.0), ("bf16", 1024, "hnas_triton"): timing(1.0),
               ("bf16", 1024, "dnas_flex"): timing(0.5), ("bf16", 1024, "hnas_flex"): timing(1.2),
               ("bf16", 8192, "dnas_triton"): timing(1.0), ("bf16", 8192, "hnas_triton"): timing(1.0),
               ("bf16", 8192, "dnas_flex"): timing(2.0), ("bf16", 8192, "hnas_flex"): timing(1.2),
               ("fp32", 1024, "dnas_triton"): timing(1.0),  # Flex not measured: no choice
               ("fp32", 1024, "dnas_flex"): {"skipped": "out of memory"}}
    table = bench.choices_from(results, 64)
    assert table == {"1024/64/bfloat16": "flex", "8192/64/bfloat16": "triton"}
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "a test GPU")
    file = tmp_path / "cuda_choices.json"
    file.write_text(json.dumps({"choices": {"1024/128/bfloat16": "flex"}}))
    bench.write_choices(table, file)
    assert json.loads(file.read_text())["choices"] == {**table, "1024/128/bfloat16": "flex"}
    assert bench.flops(1, 1, 1024, 64, backward=True) == 3.5 * 4 * 1024**2 * 64


def test_the_cuda_bench_goes_on_past_a_failing_method(bench, monkeypatch, tmp_path):
    """A method that fails its accuracy check or its timing gets the error in its rows; the
    other methods are still timed, and the exit status says that a row failed."""
    def check(method, dtype, S, d, yardstick):
        if method == "dnas_flex":
            raise RuntimeError("DNAS FlexAttention in torch.bfloat16: error 3e-1 over 16x SDPA's")
        return 1.0

    def measure(method, S, dtype, args):
        if method == "hnas_triton" and S == 4096:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return {"fwd": S / 1e6, "fwdbwd": 3 * S / 1e6, "peak_gib": S / 1024}

    monkeypatch.setattr(bench, "sdpa_error", lambda dtype, S, d: 1e-3)
    monkeypatch.setattr(bench, "check", check)
    monkeypatch.setattr(bench, "measure", measure)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "a test GPU")
    limit = torch._dynamo.config.recompile_limit  # main raises it for the whole process
    try:
        assert bench.main(["--seq", "1024", "4096", "--dtypes", "bf16", "--out-dir",
                           str(tmp_path)]) == 1
    finally:
        torch._dynamo.config.recompile_limit = limit
    (written,) = tmp_path.glob("attention-cuda-*.md")
    rows = {tuple(c.strip() for c in line.split("|")[2:4]): line
            for line in written.read_text().splitlines() if line.startswith("| bf16 |")}
    assert len(rows) == 2 * len(bench.METHODS)  # every method at both lengths
    for S in ("1024", "4096"):
        assert "error: RuntimeError: DNAS FlexAttention" in rows[S, "DNAS FlexAttention"]
        assert "ms (1.00x)" in rows[S, "HNAS FlexAttention"]  # timed after the failure
    assert "illegal memory access" in rows["4096", "HNAS Triton"]
    assert "ms (1.00x)" in rows["1024", "HNAS Triton"]


# ----------------------------------------------------------------------------- one build per forward
@pytest.mark.parametrize(("spec", "causal"), [({"scheme": "sinkhorn", "n_iter": 2}, False),
                                              ({"scheme": "sigmoid"}, True), ({"scheme": "sink"}, False),
                                              ({"scheme": "ssmax"}, True)],
                         ids=["sinkhorn", "sigmoid", "sink", "ssmax"])
def test_a_stack_builds_its_block_masks_once_per_forward(spec, causal, as_cuda, monkeypatch):
    """Issue 35, finding 4: run_stack hands its layers one MaskCache per forward, so a 3-layer
    stack on the flex paths (Sinkhorn: both orientations; causal sigmoid: rows and a mask_mod)
    builds its block masks once, with the output of a build per layer (each layer called by
    itself) and of the CPU paths; the next forward, with another padding mask of the same
    shape, builds anew."""
    from attnlab.attention import TransformerEncoderLayer, run_stack

    torch.manual_seed(0)
    layers = [TransformerEncoderLayer(32, 2, 64, 0.0, spec=spec, causal=causal, layer_index=i).eval()
              for i in range(3)]
    built = []
    real = flex.block_masks
    monkeypatch.setattr(flex, "block_masks", lambda *a, **kw: built.append(a[:3]) or real(*a, **kw))

    def per_layer(x, mask):  # every attention call builds its own masks
        for layer in layers:
            x = layer(x, mask)
        return x

    x = torch.randn(3, 20, 32)
    lengths = [(20, 13, 7), (5, 20, 16)]  # the same (B, S) shape, other padding
    for n, mask in enumerate(torch.arange(20) >= torch.tensor(lens)[:, None] for lens in lengths):
        with torch.no_grad():
            before = len(built)
            out = run_stack(layers, x, mask)
            assert len(built) - before == 1, f"forward {n}: {len(built) - before} builds"
            torch.testing.assert_close(out, per_layer(x, mask), atol=0, rtol=0)
            assert len(built) - before == 4  # (the per-layer run: 3 more)
            with monkeypatch.context() as cpu:
                cpu.setattr(paths, "device_type", lambda t: t.device.type)
                torch.testing.assert_close(out, run_stack(layers, x, mask), atol=2e-5, rtol=0)
    assert built == [(3, 20, 20)] * 8
    if spec["scheme"] == "sinkhorn":
        assert as_cuda == ["flex"] * 12  # every attention on the flex path


def test_a_decoding_step_builds_its_block_masks_once(as_cuda, monkeypatch):
    """step_stack hands the layers of one step one MaskCache: each block mask (the self-attention's
    over the cached keys, the cross-attention's of the source's padding) is built at the first
    layer only, not once per layer; the steps equal the full pass."""
    from attnlab.attention import DecoderCache, TransformerDecoderLayer, run_stack, step_stack

    torch.manual_seed(1)
    layers = nn.ModuleList(TransformerDecoderLayer(32, 2, 64, 0.0, spec="sigmoid", layer_index=i)
                           for i in range(3)).eval()
    x, memory = torch.randn(2, 4, 32), torch.randn(2, 7, 32)
    memory_mask = torch.arange(7) >= torch.tensor([7, 5])[:, None]
    built = []
    real = flex.block_masks
    monkeypatch.setattr(flex, "block_masks", lambda *a, **kw: built.append(a[:3]) or real(*a, **kw))
    with torch.no_grad():
        full = run_stack(layers, x, memory, memory_key_padding_mask=memory_mask)
        cache = DecoderCache.start(layers, memory, memory_mask)
        for t in range(3):
            before = len(built)
            out = step_stack(layers, x[:, t:t + 1], cache)
            # the self-attention's (t + 1 cached keys) and the cross-attention's: once each
            assert built[before:] == [(2, 1, t + 1), (2, 1, 7)], f"step {t}: {built[before:]}"
            torch.testing.assert_close(out[:, 0], full[:, t], atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- what Triton is handed
def test_triton_is_handed_the_calls_tensors_u_masks_and_dropout(as_cuda, monkeypatch):
    seen = []
    monkeypatch.setattr(triton_ops, "query_normalized_attend_triton",
                        lambda *args, **kwargs: seen.append((args, kwargs)) or torch.zeros_like(args[0]))
    q, k, v, _, kpm, qpm = padded_problem(6, 5, 16, B=2, H=2, seed=12)
    u = torch.tensor([0.25, 0.75]).view(1, 2, 1, 1)
    attend(q, k, v, "hnas", kpm, qpm, dropout_p=0.1, u=u)
    attend(q, k, v, "dnas", None, qpm)
    (hnas_args, hnas_kwargs), (dnas_args, dnas_kwargs) = seen
    assert hnas_kwargs == {"dropout_p": 0.1} and dnas_kwargs == {"dropout_p": 0.0}
    assert len(hnas_args) == len(dnas_args) == 6
    for got, expected in zip(hnas_args, (q, k, v, u, kpm, qpm)):
        assert torch.equal(got, expected)
    assert dnas_args[3] is None and dnas_args[4] is None and torch.equal(dnas_args[5], qpm)


def test_triton_declines_head_dims_past_its_limit_once_with_the_reason(as_cuda, caplog):
    """Past 256 Triton declines (said once, with the reason) and FlexAttention too: the
    reference; a head dim it takes is said nothing about."""
    d = triton_query_normalized.MAX_HEAD_DIM + 4
    wide = padded_problem(3, 4, d, B=1, seed=13)[:3]
    narrow = padded_problem(3, 4, 16, B=1, seed=13)[:3]
    triton_query_normalized.log_decline.cache_clear()  # once per process
    flex.log_decline_once.cache_clear()
    with caplog.at_level("WARNING"):
        assert route(*narrow, "dnas") == "triton"
        assert route(*wide, "dnas") == "reference"
        assert route(*wide, "dnas") == "reference"
    declined = [r.getMessage() for r in caplog.records if r.name == triton_query_normalized.__name__]
    assert declined == [(f"head dims d={d}, d_v={d} exceed the Triton DNAS/HNAS kernels' limit of "
                         f"{triton_query_normalized.MAX_HEAD_DIM}: running the scheme's next path (the "
                         f"reference on CUDA) instead")]
    triton_query_normalized.log_decline.cache_clear()


@pytest.fixture
def cuda_autocast(monkeypatch):
    """CUDA autocast on, in bf16 (its flag faked: no GPU here; the CPU's is left alone)."""
    real = torch.is_autocast_enabled
    before = torch.get_autocast_dtype("cuda")
    monkeypatch.setattr(torch, "is_autocast_enabled", lambda device="cuda": device == "cuda" or real(device))
    torch.set_autocast_dtype("cuda", BF16)
    yield
    torch.set_autocast_dtype("cuda", before)


def test_cuda_paths_take_the_autocast_dtype_under_cuda_autocast(as_cuda, cuda_autocast, monkeypatch):
    """Under CUDA autocast a float32 call reaches the CUDA kernel in the autocast dtype (bf16);
    float64 stays float64, which no CUDA kernel takes: the reference."""
    seen = []
    monkeypatch.setattr(triton_ops, "query_normalized_attend_triton",
                        lambda q, k, v, *args, **kwargs: seen.append((q.dtype, k.dtype, v.dtype)) or torch.zeros_like(q))
    q, k, v, _, kpm, qpm = padded_problem(6, 5, 16, B=2, seed=14)
    assert paths.working_dtype(q, "cuda") == BF16 and paths.working_dtype(q, "cpu") == F32
    attend(q, k, v, "dnas", kpm, qpm)
    assert seen == [(BF16, BF16, BF16)]
    wide = [t.double() for t in (q, k, v)]
    assert paths.working_dtype(wide[0], "cuda") == torch.float64
    assert route(*wide, "dnas", kpm, qpm) == "reference"


def test_where_the_table_prefers_flex_flex_still_checks_the_value_width(as_cuda, choices):
    """The table is keyed by d: a call of a measured d whose values are wider than FlexAttention
    takes (d_v > 256: VQA's fusion) is declined by Flex (and Triton), not run: the reference."""
    choices({"1024/16/float32": "flex"})
    q, k, v, _, _, _ = padded_problem(3, 4, 16, d_v=flex.MAX_HEAD_DIM + 4, B=1, seed=15)
    assert route(q, k, v, "dnas") == "reference"
    q, k, v, _, _, _ = padded_problem(3, 4, 16, B=1, seed=15)
    assert route(q, k, v, "dnas") == "flex"

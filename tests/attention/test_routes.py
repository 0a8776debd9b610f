"""`route` names the kernel that runs, for every registered scheme: each cell of docs/attention.md's
routes table (CPU, one call per kind) is run with every kernel's entry point spied, and on the
CUDA dispatch with CPU tensors routed as CUDA ones. Parametrized over the registry, so a new
scheme is covered without an edit."""

from __future__ import annotations

import pytest
import torch
from helpers.paths import ROOT

from attnlab.attention import MultiHeadAttention, attend, paths
from attnlab.attention.functional import route
from attnlab.attention.kernels import (
    composed,
    entmax_blocks,
    flex,
    flex_rowwise,
    fused,
    rowwise,
    sdpa,
    triton_ops,
    triton_query_normalized,
)
from attnlab.attention.kernels import esp as sliced
from attnlab.attention.kernels import stickbreaking as blocked
from attnlab.attention.schemes import HEAD_SCHEMES, NORMALIZERS, TRANSFORMS, Heads, Normalizer
from attnlab.docs import CALL_KINDS, ROUTES_BEGIN, ROUTES_END, between, route_call
from attnlab.errors import ConfigError

# every kernel entry point a fast path may call, spied by name
ENTRIES = {sdpa: ("unas_sdpa", "unas_sdpa_math"), fused: ("unas_attend", "query_normalized_attend"),
           composed: ("dnas_flash", "hnas_flash"),
           rowwise: ("sigmoid_attend", "sink_attend", "softpick_attend"),
           flex: ("query_normalized_attend_flex",),
           flex_rowwise: ("sigmoid_attend_flex", "sink_attend_flex", "ssmax_attend_flex"),
           triton_ops: ("query_normalized_attend_triton",), blocked: ("stickbreaking_attend",),
           sliced: ("esp_weights_chunked",), entmax_blocks: ("entmax_attend",)}
# the kernels behind each path name (a path whose name is not here is checked by name only)
KERNELS = {"sdpa": {"sdpa.unas_sdpa"}, "sdpa_math": {"sdpa.unas_sdpa_math"},
           "fused_cpu": {"fused.unas_attend", "fused.query_normalized_attend", "rowwise.sigmoid_attend",
                         "rowwise.sink_attend", "rowwise.softpick_attend"},
           "scaled_sdpa": {"sdpa.unas_sdpa"}, "scaled_fused_cpu": {"fused.unas_attend"},
           "composed": {"composed.dnas_flash", "composed.hnas_flash"},
           "triton": {"triton_ops.query_normalized_attend_triton"},
           "flex": {"flex.query_normalized_attend_flex", "flex_rowwise.sigmoid_attend_flex",
                    "flex_rowwise.sink_attend_flex", "flex_rowwise.ssmax_attend_flex"},
           "blocked": {"stickbreaking.stickbreaking_attend", "entmax_blocks.entmax_attend"},
           "chunked": {"esp.esp_weights_chunked"},
           "reference": {"reference"}}


def documented_routes() -> dict[tuple[str, str], str]:
    """{(scheme, kind): cell} of docs/attention.md's routes table."""
    rows = between((ROOT / "docs" / "attention.md").read_text(), ROUTES_BEGIN, ROUTES_END).splitlines()
    kinds = [c.strip() for c in rows[0].strip("|").split("|")][1:]
    table = {}
    for row in rows[2:]:
        scheme, *cells = (c.strip().strip("`") for c in row.strip("|").split("|"))
        table.update({(scheme, kind): cell for kind, cell in zip(kinds, cells)})
    return table


@pytest.fixture
def ran(monkeypatch):
    """What runs, in order: the fast path called (`path:<name>`), each kernel entry point
    (`<module>.<function>`) and the reference. `triton` stands in zeros (test_triton_kernels
    checks the kernel)."""
    seen = []
    real_call, real_reference = paths.FastPath.__call__, Normalizer.reference

    def call(self, normalizer, c):
        seen.append(f"path:{self.name}")
        return real_call(self, normalizer, c)

    monkeypatch.setattr(paths.FastPath, "__call__", call)
    monkeypatch.setattr(Normalizer, "reference", lambda self, c: seen.append("reference") or real_reference(self, c))
    for module, names in ENTRIES.items():
        for name in names:
            real = getattr(module, name)
            label = f"{module.__name__.rpartition('.')[2]}.{name}"

            def spy(*args, _real=real, _label=label, **kwargs):
                seen.append(_label)
                if _label.startswith("triton_ops."):
                    q, v = args[0], args[2]
                    return torch.zeros(*q.shape[:3], v.shape[-1], dtype=q.dtype)
                return _real(*args, **kwargs)

            monkeypatch.setattr(module, name, spy)
    return seen


def check_runs_what_route_names(name: str, seen: list[str]) -> None:
    paths_run = [s for s in seen if s.startswith("path:")]
    kernels = [s for s in seen if not s.startswith("path:")]
    if name == "reference":
        assert paths_run == [] and kernels[:1] == ["reference"], seen
        return
    assert paths_run == [f"path:{name}"], seen
    assert kernels and kernels[0] in KERNELS.get(name, {kernels[0]}), seen


@pytest.mark.parametrize("kind", CALL_KINDS, ids=[k[0] for k in CALL_KINDS])
@pytest.mark.parametrize("scheme", sorted(NORMALIZERS))
def test_route_names_the_cpu_kernel_that_runs_as_the_docs_table_says(scheme, kind, ran):
    heading, padded, causal, dropout_p = kind
    (q, k, v, *rest), inputs = route_call(scheme, padded, causal, dropout_p)
    documented = documented_routes()[(scheme, heading)]
    try:
        name = route(q, k, v, scheme, *rest, **inputs)
    except ConfigError:
        assert documented == "refused"
        return
    assert documented == name, f"docs/attention.md says {documented}, route {name}: run `make docs`"
    torch.manual_seed(0)
    attend(q, k, v, scheme, *rest, **inputs)
    check_runs_what_route_names(name, ran)


# on the CUDA dispatch (CPU tensors routed as CUDA ones, Triton 'available'): bf16 calls
CUDA_KINDS = [("plain", False, False, 0.0), ("padding", True, False, 0.0),
              ("causal", False, True, 0.0), ("padding, dropout", True, False, 0.1)]


@pytest.mark.parametrize("kind", CUDA_KINDS, ids=[k[0] for k in CUDA_KINDS])
@pytest.mark.parametrize("scheme", sorted(NORMALIZERS))
def test_route_names_the_cuda_kernel_that_runs(scheme, kind, ran, monkeypatch):
    monkeypatch.setattr(paths, "device_type", lambda t: "cuda")
    monkeypatch.setattr(triton_query_normalized, "available", lambda device: device == "cuda")
    _, padded, causal, dropout_p = kind
    (q, k, v, *rest), inputs = route_call(scheme, padded, causal, dropout_p)
    q, k, v = (t[:, :, :40].to(torch.bfloat16) for t in (q, k, v))  # eager flex on the CPU: short
    rest[:2] = [None if m is None else m[:, :40] for m in rest[:2]]
    try:
        name = route(q, k, v, scheme, *rest, **inputs)
    except ConfigError:
        return  # refused: the CPU test checks the refusal against the table
    attend(q, k, v, scheme, *rest, **inputs)
    check_runs_what_route_names(name, ran)


@pytest.mark.parametrize("kind", CALL_KINDS, ids=[k[0] for k in CALL_KINDS])
@pytest.mark.parametrize("scheme", sorted({*TRANSFORMS, *HEAD_SCHEMES}))
def test_transforms_and_head_schemes_run_as_the_docs_table_says(scheme, kind, ran):
    """A transform or head scheme runs what its table cell says: "materialized" (no fast path
    runs), its own "blocks" (selective's kernel, no normalizer path either), or the
    normalizer's fast paths named (diff: one call per map and value piece, each that path)."""
    heading, padded, causal, dropout_p = kind
    documented = documented_routes()[(scheme, heading)]
    if documented == "refused":
        assert getattr(TRANSFORMS.get(scheme), "causal_only", False) and not causal
        return
    (q, k, v, kpm, qpm, *_), _ = route_call("unas", padded, causal, dropout_p)
    b, h, s, d = q.shape
    module = MultiHeadAttention(h * d, h, spec=scheme, dropout=dropout_p)
    structure = module.head_scheme if module.head_scheme is not None else module.transform
    named = structure.route(module.normalizer, Heads(
        q, k, v, kpm, qpm, causal, dropout_p, None, q.transpose(1, 2).reshape(b, s, h * d))
    ) if hasattr(structure, "route") else "materialized"
    assert documented == named, f"docs/attention.md says {documented}, route {named}: run `make docs`"
    module(q.transpose(1, 2).reshape(b, s, h * d), key_padding_mask=kpm, query_padding_mask=qpm,
           causal=causal)
    paths_run = {r for r in ran if r.startswith("path:")}
    if named in ("materialized", "blocks"):
        assert paths_run == set(), ran
    else:
        assert paths_run == {f"path:{n}" for n in named.split("+")}, ran

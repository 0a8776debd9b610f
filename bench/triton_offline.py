"""The Triton DNAS / HNAS kernels compiled ahead of time for H100 (sm_90a) and A100 (sm_80),
on a machine without a GPU: what a GPU would refuse (shared memory) or run slowly (register
spills) shows up in CI, not on the next lent GPU. A build-time tool, outside the attnlab package
(no run imports it); its test is tests/bench/test_triton_offline.py.

    python bench/triton_offline.py         # the test's set, as markdown
    python bench/triton_offline.py --all   # every tile the autotuner may pick (make triton-compile)

Nothing here is hand-listed, so a change to the kernels is followed without an edit:

- **Arguments: what the host passes.** `launches` runs the host's own forward and backward
  (`triton_query_normalized.forward` / `backward`) on meta tensors (shapes, strides and dtypes,
  no data) with its `_launch` replaced by a recorder, so every kernel gets the argument list,
  the compile-time flags (HYBRID, masks, DROPOUT, BLOCK_D, PRECISION ...) and the integer
  values a real call would give it, whatever the kernels' signatures are today.
- **Signature and specialization: Triton's own.** The JITFunction's binder (the one `fn[grid]`
  uses) turns those arguments into the signature, constexprs and divisibility attributes, and
  `triton.compile(ASTSource(...), target=GPUTarget(...))` compiles them: Triton's public compile
  path, with no driver and no CUDA library (the bundled ptxas makes the cubin).
- **Configs: the autotuner's.** Each kernel's `triton.autotune` wrapper (its `configs` and its
  `early_config_prune`, `_triton_configs.py`) says which tiles the autotuner may choose for a
  call on each arch (its `_arch` is told the target); `--every-config` adds the pruned ones.

Per configuration: shared memory (`metadata.shared`, what Triton launches with, plus the
cubin's static shared memory, which the driver subtracts from the opt-in limit), registers per
thread and spill bytes (ptxas -v, the numbers Triton prints with TRITON_DUMP_PTXAS_LOG). Limits
per block (NVIDIA/cccl `cuda/__device/arch_traits.h`, the device attribute
MAX_SHARED_MEMORY_PER_BLOCK_OPTIN that Triton checks at load): sm_90 228 KB per SM - 1 KB
reserved = 227 KB; sm_80 164 - 1 = 163 KB. A compile error, shared memory over the limit or any
spill is a problem (`Result.problems`); the tests fail on them.

Integer arguments are specialized as in a real call with B = 2, H = 8, S_q = S_k = 1024
(lengths divisible by 16); other lengths compile other (similar) binaries. Not possible under
TRITON_INTERPRET=1 (the kernels are then interpreted functions): run without it.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import functools
import io
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

# arch -> (compute capability, shared memory a block may opt into, bytes)
TARGETS = {"sm_90a": (90, 227 * 1024), "sm_80": (80, 163 * 1024)}
KERNELS = ("column_lse", "forward", "backward_kv", "backward_q", "backward_dv_dc", "backward_dk_dq")
DTYPES = ("bfloat16", "float16", "float32")
# the shape whose integers the kernels are specialized on (see the docstring)
SHAPE = {"B": 2, "H": 8, "S": 1024}


@dataclasses.dataclass(frozen=True)
class Case:
    kernel: str
    hybrid: bool
    dtype: str
    d: int
    dv: int
    arch: str
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    kept: bool = True  # the autotuner may choose it (not pruned)

    @property
    def scheme(self) -> str:
        # the column LSE has no HYBRID flag: one kernel serves both schemes
        return "HNAS" if self.hybrid else "DNAS"

    @property
    def tile(self) -> str:
        return f"{self.block_m}x{self.block_n} w{self.num_warps} s{self.num_stages}"


@dataclasses.dataclass(frozen=True)
class Result:
    case: Case
    shared: int | None = None  # bytes per block: dynamic (metadata.shared) + static
    registers: int | None = None
    spill_stores: int | None = None
    spill_loads: int | None = None
    seconds: float = 0.0
    error: str | None = None

    @property
    def problems(self) -> list[str]:
        if self.error is not None:
            return [f"compile error: {self.error}"]
        out = []
        limit = TARGETS[self.case.arch][1]
        if self.shared > limit:
            out.append(f"shared memory {self.shared} B > {limit} B ({self.case.arch} limit)")
        if self.spill_stores or self.spill_loads:
            out.append(f"register spills: {self.spill_stores} B stored, {self.spill_loads} B "
                       f"loaded")
        return out


def _interpreting() -> bool:
    from triton import knobs

    return knobs.runtime.interpret


@functools.cache
def launches(hybrid: bool, dtype: str, d: int, dv: int) -> dict[str, tuple[tuple, dict]]:
    """kernel name -> (positional args, keyword args) of the host's launches for one forward +
    backward call with key and query padding and dropout (by seed), on meta tensors."""
    import torch

    from attnlab.attention.kernels import triton_query_normalized as tq

    recorded = {}

    def record(name, device, owned_rows, heads, *args, **meta):
        recorded[name] = (args, meta)

    B, H, S = SHAPE["B"], SHAPE["H"], SHAPE["S"]
    meta = {"device": "meta", "dtype": getattr(torch, dtype)}
    q, k = torch.empty(B, H, S, d, **meta), torch.empty(B, H, S, d, **meta)
    v = torch.empty(B, H, S, dv, **meta)
    u = torch.empty(B * H, device="meta") if hybrid else None
    pad = torch.zeros(B, S, dtype=torch.bool, device="meta")
    before = torch.are_deterministic_algorithms_enabled()
    try:
        with mock.patch.object(tq, "_launch", record):
            out, c, lse_d, lse_u, _, _ = tq.forward(q, k, v, u, pad, pad, 0.1, 1234, None)
            for deterministic in (True, False):  # both backwards (triton_query_normalized)
                torch.use_deterministic_algorithms(deterministic)
                tq.backward(torch.empty_like(out), q, k, v, u, c, lse_d, lse_d, lse_u, lse_u,
                            pad, pad, 0.1, 1234, None)
    finally:
        torch.use_deterministic_algorithms(before)
    missing = set(KERNELS) - set(recorded)
    if missing:
        raise RuntimeError(f"the host launched no {sorted(missing)}: update KERNELS in "
                           "bench/triton_offline.py to the kernels triton_query_normalized "
                           "launches")
    return recorded


def _tuner(kernel: str):
    if _interpreting():
        raise RuntimeError("ahead-of-time compilation needs the compiled kernels, not "
                           "interpreted ones: run without TRITON_INTERPRET=1")
    from attnlab.attention.kernels import triton_query_normalized as tq

    return getattr(tq._kernels(), kernel)  # a triton Autotuner around the JITFunction


def autotuner_configs(kernel: str, hybrid: bool, dtype: str, d: int, dv: int, arch: str):
    """(every config of the kernel, those its autotuner may choose for this call on `arch`)."""
    from attnlab.attention.kernels import _triton_configs

    tuner = _tuner(kernel)
    args, meta = launches(hybrid, dtype, d, dv)[kernel]
    tuner.nargs = dict(zip(tuner.arg_names, args))
    # the prune asks the tensors' GPU which arch's spill table applies: here, the target's;
    # and the autotuned set, not the pinned one (ATTNLAB_TRITON_AUTOTUNE=0 keeps its first)
    target = mock.patch.object(_triton_configs, "_arch", lambda named_args: TARGETS[arch][0])
    try:
        with target, mock.patch.dict(os.environ, {"ATTNLAB_TRITON_AUTOTUNE": "1"}):
            kept = tuner.prune_configs(meta)
    finally:
        tuner.nargs = None
    return list(tuner.configs), list(kept)


def cases(kernels=KERNELS, schemes=(False, True), dtypes=("bfloat16",), dims=(64, 128),
          arches=tuple(TARGETS), every_config=False, first_only=False) -> list[Case]:
    """The (kernel, scheme, dtype, d = d_v, arch, config) combinations to compile: the configs
    the autotuner may choose (`first_only`: its first, the largest tile; `every_config`: the
    pruned ones too). The column LSE has no scheme flag: listed once, as DNAS."""
    out = []
    for kernel in kernels:
        for hybrid in schemes:
            if hybrid and kernel == "column_lse":
                continue
            for dtype in dtypes:
                for d in dims:
                    for arch in arches:
                        every, kept = autotuner_configs(kernel, hybrid, dtype, d, d, arch)
                        chosen = every if every_config else (kept[:1] if first_only else kept)
                        out += [Case(kernel, hybrid, dtype, d, d, arch, c.kwargs["BLOCK_M"],
                                     c.kwargs["BLOCK_N"], c.num_warps, c.num_stages, c in kept)
                                for c in chosen]
    return out


_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_PTXAS_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def _ptxas_usage(log: str) -> tuple[int, int, int]:
    regs, spills = _PTXAS_REGS.search(log), _PTXAS_SPILLS.search(log)
    if not (regs and spills):
        raise RuntimeError(f"no register / spill lines in ptxas' log:\n{log}")
    return int(regs[1]), int(spills[1]), int(spills[2])


def _static_shared(cubin: bytes, ptxas: str) -> int:
    """The cubin's static shared memory (cuobjdump, bundled with Triton next to ptxas)."""
    cuobjdump = Path(ptxas).with_name("cuobjdump")
    with _scratch_file(cubin, ".cubin") as path:
        usage = subprocess.run([str(cuobjdump), "-res-usage", path], capture_output=True,
                               text=True, check=True).stdout
    return int(re.search(r"SHARED:(\d+)", usage)[1])


@contextlib.contextmanager
def _scratch_file(data: bytes, suffix: str):
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=suffix) as f:
        f.write(data)
        f.flush()
        yield f.name


def compile_case(case: Case):
    """(triton CompiledKernel, ptxas' log) of one case; raises what Triton raises."""
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    fn = _tuner(case.kernel).fn
    target = GPUTarget("cuda", TARGETS[case.arch][0], 32)
    backend = make_backend(target)
    args, meta = launches(case.hybrid, case.dtype, case.d, case.dv)[case.kernel]
    # as JITFunction.run binds a launch (with the config's kwargs, as the Autotuner adds them)
    kwargs = {**meta, "BLOCK_M": case.block_m, "BLOCK_N": case.block_n,
              "num_warps": case.num_warps, "num_stages": case.num_stages,
              "debug": fn.debug or knobs.runtime.debug,
              "instrumentation_mode": knobs.compilation.instrumentation_mode}
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound,
                                                          specialization, options)
    log = io.StringIO()
    # ptxas' -v log is printed only when Triton runs ptxas (not on a cache hit): then ptxas
    # runs again on the cached PTX, with Triton's own command line (backend.make_cubin)
    with knobs.nvidia.scope(), contextlib.redirect_stdout(log):
        knobs.nvidia.dump_ptxas_log = True
        compiled = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target,
                                  options=options.__dict__)
        if not _PTXAS_REGS.search(log.getvalue()):
            backend.make_cubin(compiled.asm["ptx"], {}, options, target.arch)
    return compiled, log.getvalue()


def measure(case: Case) -> Result:
    """Compile one case; a compile error is recorded (one line), not raised."""
    from triton.backends.nvidia.compiler import get_ptxas

    start = time.perf_counter()
    try:
        compiled, log = compile_case(case)
        regs, stores, loads = _ptxas_usage(log)
        shared = compiled.metadata.shared + _static_shared(
            compiled.asm["cubin"], get_ptxas(TARGETS[case.arch][0]).path)
    except Exception as e:  # noqa: BLE001 - the error is the result
        # Triton's CompilationError wraps the source around the error: its innermost cause
        # (e.g. "ValueError: Cannot broadcast ...") says what is wrong
        root = e
        while root.__cause__ is not None:
            root = root.__cause__
        lines = [line.strip() for line in str(root).splitlines() if line.strip()] or [""]
        where = f" (in {type(e).__name__} {str(e).split(':')[0]})" if root is not e else ""
        return Result(case, seconds=time.perf_counter() - start,
                      error=f"{type(root).__name__}: {lines[0][:300]}{where}")
    return Result(case, shared, regs, stores, loads, time.perf_counter() - start)


def measure_all(cases_: list[Case], jobs: int | None = None) -> list[Result]:
    """Every case, in `jobs` processes (default: one per CPU); results in the cases' order."""
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(cases_)))
    if jobs == 1:
        return [measure(c) for c in cases_]
    # the longest first (d, float32, 8 warps compile slowest): the pool ends together
    order = sorted(range(len(cases_)), key=lambda i: -_cost(cases_[i]))
    with concurrent.futures.ProcessPoolExecutor(jobs) as pool:
        done = dict(zip(order, pool.map(measure, [cases_[i] for i in order])))
    return [done[i] for i in range(len(cases_))]


def _cost(case: Case) -> int:
    return case.d * case.block_m * case.block_n * (2 if case.dtype == "float32" else 1)


def markdown(results: list[Result]) -> str:
    """One row per (kernel, scheme, dtype, d, tile), the arches side by side; "pruned": the
    autotuner does not choose that tile on that arch."""
    arches = list(dict.fromkeys(r.case.arch for r in results))
    rows: dict[tuple, dict[str, Result]] = {}
    for r in results:
        key = dataclasses.replace(r.case, arch="", kept=True)
        rows.setdefault(key, {})[r.case.arch] = r
    head = ["kernel", "scheme", "dtype", "d", "tile (M x N, warps, stages)"]
    for arch in arches:
        head += [f"{arch} shared KB", "regs", "spills B", "chosen"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for case, by_arch in rows.items():
        cells = [case.kernel, case.scheme, case.dtype, str(case.d), case.tile]
        for arch in arches:
            r = by_arch.get(arch)
            if r is None:
                cells += ["", "", "", ""]
                continue
            kept = "yes" if r.case.kept else "pruned"
            if r.error:
                cells += ["error", "", r.error[:60], kept]
            else:
                over = " (over)" if r.shared > TARGETS[arch][1] else ""
                cells += [f"{r.shared / 1024:.1f}{over}", str(r.registers),
                          str(r.spill_stores + r.spill_loads), kept]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python bench/triton_offline.py",
        description="Compile the Triton DNAS/HNAS kernels for sm_90a and sm_80 without a GPU; "
                    "print shared memory, registers and spills per config (markdown).")
    p.add_argument("--all", action="store_true",
                   help="every config the autotuner may choose, d in 64 128 256, bf16 fp16 "
                        "fp32 (default: the test's set, the first config, bf16, d 64 128)")
    p.add_argument("--every-config", action="store_true",
                   help="the configs the autotuner prunes, too")
    p.add_argument("--dtypes", nargs="+", choices=DTYPES)
    p.add_argument("--dims", nargs="+", type=int)
    p.add_argument("--kernels", nargs="+", choices=KERNELS, default=list(KERNELS))
    p.add_argument("--arches", nargs="+", choices=list(TARGETS), default=list(TARGETS))
    p.add_argument("--jobs", type=int, help="compile processes (default: one per CPU)")
    a = p.parse_args(argv)
    dtypes = a.dtypes or (list(DTYPES) if a.all else ["bfloat16"])
    dims = a.dims or ([64, 128, 256] if a.all else [64, 128])
    todo = cases(a.kernels, (False, True), dtypes, dims, a.arches, a.every_config,
                 first_only=not (a.all or a.every_config))
    start = time.perf_counter()
    results = measure_all(todo, a.jobs)
    print(markdown(results))
    bad = [(r, p) for r in results if r.case.kept for p in r.problems]
    print(f"\n{len(results)} compiles in {time.perf_counter() - start:.0f} s "
          f"({os.cpu_count()} CPUs); {len(bad)} problems in configs the autotuner may choose",
          file=sys.stderr)
    for r, problem in bad:
        print(f"{r.case}: {problem}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

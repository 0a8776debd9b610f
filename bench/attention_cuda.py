"""The CUDA benchmark: `python bench/attention.py --device cuda` (or this file directly).

    python bench/attention.py --device cuda                    # bf16 + fp32, S = 1k ... 16k
    python bench/attention.py --device cuda --seq 1024 4096 --dtypes bf16
    python bench/attention.py --device cuda --write-choices    # + the dispatcher's table

Times, in one process, B=8, H=12, d=64 by default:
- UNAS through SDPA pinned to flash (`sdpa_kernel(SDPBackend.FLASH_ATTENTION)`; flash takes no
  fp32, so fp32 rows pin the memory-efficient backend and say so): the baseline;
- DNAS and HNAS on the Triton kernels and on FlexAttention, each through its fast path
  (`attnlab.attention.paths`) called directly: a path that declines (it would have fallen back
  to the reference) is an error, so no row ever times the wrong thing.

Each method is checked and timed on its own: one that fails (declines, errs past the tolerance,
crashes) gets its error in its rows and the bench goes on with the others; the exit status is 1
when any row failed. Every result is printed (stderr) as soon as it is measured.

Forward (no grad) and forward + backward; after one warm-up call (Triton and torch.compile
compile then), --repeats synchronized runs, median. TFLOP/s counts the FLOPs of standard
attention as flash-attention's benchmarks do, the same count for every method: forward
4 B H S^2 d (QK^T and PV, 2 FLOPs per multiply-add), backward 2.5x the forward (5 matmuls), so
forward + backward 14 B H S^2 d. A DNAS/HNAS row's TFLOP/s is thus *effective* (UNAS's work per
second): the Triton kernels do 9 (DNAS) / 11 (HNAS) matmuls per score to flash's 7, so 1.29x /
1.57x flash's time is their floor, and 11 / 12 in deterministic mode (the `_det` rows, whose
backward has no atomics), 1.57x / 1.71x (docs/gpu.md, "Work per score", counts the exponentials
too).
Peak memory = torch.cuda.max_memory_allocated() during forward + backward,
inputs and gradients included (they alone are 8 B H S d bytes in bf16 at d_v = d).

Before timing, every method's output and dq/dk/dv (and du) are checked against the float64
reference at a small S (--check-seq): the error must stay within 16x SDPA's own error in that
dtype on the same inputs, or the method is not timed (its rows say why). The Markdown table is
printed and written to bench/results/attention-cuda-<time>.md. --write-choices then records, per
(S, d, dtype), which of Triton and Flex was faster for DNAS + HNAS forward + backward into the
dispatcher's table (`cuda_table.CUDA_CHOICES_FILE`, read by `attend` on CUDA; see docs/gpu.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

LENGTHS = (1024, 2048, 4096, 8192, 16384)
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
METHODS = {
    "sdpa_flash": "UNAS, SDPA flash",
    "dnas_triton": "DNAS Triton",
    "dnas_flex": "DNAS FlexAttention",
    "hnas_triton": "HNAS Triton",
    "hnas_flex": "HNAS FlexAttention",
    # torch's deterministic mode: the Triton backward without atomics (docs/gpu.md)
    "dnas_triton_det": "DNAS Triton, deterministic",
    "hnas_triton_det": "HNAS Triton, deterministic",
}
TOLERANCE = 16  # x SDPA's own error against float64 (see the module docstring)
NO_CUDA = ("bench/attention.py --device cuda needs a CUDA device; torch {} sees none here "
           "(run it on a GPU machine, or drop --device cuda for the CPU benchmark)")


def flops(B: int, H: int, S: int, d: int, backward: bool) -> float:
    """Standard attention's FLOPs (the count of every row; see the module docstring)."""
    forward = 4 * B * H * S * S * d
    return forward * (3.5 if backward else 1.0)


def _method(name: str, dtype: torch.dtype):
    """(q, k, v, u) -> out for `name`, running exactly the named kernel or raising."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from attnlab.attention import cuda_table
    from attnlab.attention.functional import normalizer
    from attnlab.attention.schemes import dnas

    if name == "sdpa_flash":
        backend = SDPBackend.FLASH_ATTENTION if dtype != torch.float32 else \
            SDPBackend.EFFICIENT_ATTENTION  # flash has no fp32 kernel

        def sdpa(q, k, v, u):
            with sdpa_kernel(backend):  # only this backend: an error, never another one
                return torch.nn.functional.scaled_dot_product_attention(q, k, v)

        return sdpa
    scheme, kernel = name.split("_")[:2]
    path = {"triton": dnas.TRITON, "flex": dnas.FLEX}[kernel]

    norm, _ = normalizer(scheme)  # built once, as a module holds it

    def run(q, k, v, u):
        with cuda_table.pinned_cuda_path(kernel):  # whatever the measured table says
            call = norm.call(q, k, v, u=u)
            if not path.accepts(norm, call):
                raise RuntimeError(f"the {kernel} path declined {scheme} in {dtype} on this machine "
                                   f"(attend would have fallen back): nothing of it to time")
            return path(norm, call)

    return run


def _inputs(B, H, S, d, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(B, H, S, d, device="cuda", dtype=dtype, generator=g) for _ in range(3))
    u = torch.full((1, H, 1, 1), 0.5, device="cuda")
    return [t.requires_grad_() for t in (q, k, v, u)]


def sdpa_error(dtype: torch.dtype, S: int, d: int) -> float:
    """SDPA's largest output error in `dtype` against float64 on the check's inputs: the
    yardstick of every method's error."""
    q, k, v, _ = (t.detach() for t in _inputs(2, 4, S, d, dtype, seed=1))
    got = _method("sdpa_flash", dtype)(q, k, v, None).double()
    weights = torch.softmax(q.double() @ k.double().transpose(-2, -1) / d**0.5, dim=-1)
    return max((got - weights @ v.double()).abs().max().item(), torch.finfo(dtype).eps)


def check(method: str, dtype: torch.dtype, S: int, d: int, yardstick: float) -> float:
    """The method's largest error (output and gradients, relative to their scale) against
    float64, in units of `yardstick`; an error when it is over TOLERANCE."""
    from attnlab.attention import reference_attend

    scheme = "unas" if method == "sdpa_flash" else method.split("_")[0]
    inputs = _inputs(2, 4, S, d, dtype, seed=1)
    _set_determinism(method)
    n_wrt = 4 if scheme == "hnas" else 3  # du only where there is a u
    g_out = torch.randn_like(inputs[0], dtype=torch.float64)

    def out_and_grads(fn, tensors):
        out = fn(*tensors)
        return [out, *torch.autograd.grad((out.double() * g_out).sum(), tensors[:n_wrt])]

    got = out_and_grads(_method(method, dtype), inputs)
    ref_in = [t.detach().double().requires_grad_() for t in inputs]
    ref = out_and_grads(lambda q, k, v, u: reference_attend(q, k, v, scheme, u=u), ref_in)
    worst = max((a.double() - b).abs().max().item() / max(1.0, b.abs().max().item())
                for a, b in zip(got, ref))
    if worst > TOLERANCE * yardstick:
        raise RuntimeError(f"{METHODS[method]} in {dtype}: error {worst:.2e} against float64 at "
                           f"S={S} is over {TOLERANCE}x SDPA's ({yardstick:.2e}): not timing it")
    return worst / yardstick


def _median_time(fn, repeats: int) -> float:
    runs = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def _set_determinism(method: str) -> None:
    """The `_det` methods' backward runs in torch's deterministic mode (no atomics), the others
    in the default one: set before each method's check and timing."""
    torch.use_deterministic_algorithms(method.endswith("_det"))


def measure(method: str, S: int, dtype: torch.dtype, args) -> dict:
    fn = _method(method, dtype)
    _set_determinism(method)
    q, k, v, u = _inputs(args.batch, args.heads, S, args.head_dim, dtype)
    grad = torch.ones_like(q)

    def forward():
        with torch.no_grad():
            fn(q, k, v, u)

    def forward_backward():
        fn(q, k, v, u).backward(grad)
        for x in (q, k, v, u):
            x.grad = None

    forward_backward()  # warm-up: Triton / torch.compile compile here
    result = {"fwd": _median_time(forward, args.repeats)}
    torch.cuda.reset_peak_memory_stats()
    result["fwdbwd"] = _median_time(forward_backward, args.repeats)
    result["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return result


def _cells(res: dict, base: dict, B: int, H: int, S: int, d: int) -> str:
    """The row's cells; ratios to SDPA where SDPA itself was measured."""
    if "skipped" in res or "error" in res:
        return " | ".join([res.get("skipped") or res["error"]] * 3)

    def ratio(key):
        return f" ({res[key] / base[key]:.2f}x)" if key in base else ""

    cells = []
    for key in ("fwd", "fwdbwd"):
        tflops = flops(B, H, S, d, key == "fwdbwd") / res[key] / 1e12
        cells.append(f"{res[key] * 1e3:.2f} ms{ratio(key)}, {tflops:.1f} TFLOP/s")
    cells.append(f"{res['peak_gib']:.2f} GiB{ratio('peak_gib')}")
    return " | ".join(cells)


def _error(exc: BaseException) -> dict:
    """A failed method's row: its error in one line (a Markdown cell)."""
    line = (str(exc).strip().splitlines() or [""])[0].replace("|", "/")[:160]
    return {"error": f"error: {type(exc).__name__}: {line}"}


def run(args) -> tuple[str, dict]:
    """Check, then measure every method at every S and dtype: the table and the raw results."""
    from rich.progress import track

    methods = ["sdpa_flash"] + [m for m in args.methods if m != "sdpa_flash"]
    checks, failed = {}, {}  # failed: (dtype, method) -> the error of its check
    for name in args.dtypes:
        try:
            yardstick = sdpa_error(DTYPES[name], args.check_seq, args.head_dim)
        except Exception:  # noqa: BLE001 - SDPA's row says why; the others: the dtype's eps
            yardstick = torch.finfo(DTYPES[name]).eps
        for method in methods:
            try:
                checks[name, method] = check(method, DTYPES[name], args.check_seq,
                                             args.head_dim, yardstick)
            except Exception as exc:  # noqa: BLE001 - any failure is this method's row
                failed[name, method] = _error(exc)
                print(f"{name} {method} check: {failed[name, method]['error']}",
                      file=sys.stderr, flush=True)
    jobs = [(name, S, m) for name in args.dtypes for S in args.seq for m in methods]
    results = {}
    for name, S, method in track(jobs, description="timing"):
        try:
            results[name, S, method] = failed.get((name, method)) or measure(
                method, S, DTYPES[name], args)
        except torch.cuda.OutOfMemoryError:
            results[name, S, method] = {"skipped": "out of memory"}
        except Exception as exc:  # noqa: BLE001 - the others are still timed
            results[name, S, method] = _error(exc)
        print(f"{name} S={S} {method}: {results[name, S, method]}", file=sys.stderr, flush=True)
        torch.cuda.empty_cache()
    rows = []
    for name, S, method in jobs:
        base = results[name, S, "sdpa_flash"]
        label = METHODS[method] + (" (fp32: memory-efficient)" if method == "sdpa_flash"
                                   and name == "fp32" else "")
        rows.append(f"| {name} | {S} | {label} | "
                    f"{_cells(results[name, S, method], base, args.batch, args.heads, S, args.head_dim)} |")
    checked = ", ".join([f"{n} {m} {r:.1f}x" for (n, m), r in checks.items()]
                        + [f"{n} {m} failed" for n, m in failed])
    header = (
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, B={args.batch}, "
        f"H={args.heads}, d={args.head_dim}; median of {args.repeats} synchronized runs after a "
        f"warm-up; ratios to SDPA of the same dtype and S; TFLOP/s = standard attention's FLOPs "
        f"(fwd 4BHS^2d, fwd+bwd 14BHS^2d) / time; peak = torch.cuda.max_memory_allocated "
        f"(fwd+bwd). Checked against float64 at S={args.check_seq} (error / SDPA's error): "
        f"{checked}\n\n"
        "| dtype | S | method | forward | forward+backward | peak memory |\n|---|---|---|---|---|---|"
    )
    return header + "\n" + "\n".join(rows) + "\n", results


def choices_from(results: dict, head_dim: int) -> dict[str, str]:
    """{choice_key: "triton" | "flex"}: the faster for DNAS + HNAS forward + backward, per
    (S, dtype) where both were measured."""
    from attnlab.attention import cuda_table

    table = {}
    for name, S in {(n, s) for n, s, _ in results}:
        total = {}
        for kernel in ("triton", "flex"):
            runs = [results.get((name, S, f"{scheme}_{kernel}")) for scheme in ("dnas", "hnas")]
            if all(r and "fwdbwd" in r for r in runs):
                total[kernel] = sum(r["fwdbwd"] for r in runs)
        if len(total) == 2:
            table[cuda_table.choice_key(S, head_dim, DTYPES[name])] = min(total, key=total.get)
    return dict(sorted(table.items()))


def write_choices(table: dict[str, str], file: Path) -> None:
    """Merge `table` into the dispatcher's file (other head dims measured before stay)."""
    from attnlab.files import atomic_write_text

    old = json.loads(file.read_text()).get("choices", {}) if file.exists() else {}
    data = {
        "about": "which CUDA kernel serves DNAS / HNAS per max(S_q, S_k) bucket / head dim / "
                 "dtype; written by bench/attention.py --device cuda --write-choices",
        "device": torch.cuda.get_device_name(),
        "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "choices": {**old, **table},
    }
    atomic_write_text(file, json.dumps(data, indent=2) + "\n")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench/attention.py --device cuda", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=["cuda"])
    parser.add_argument("--seq", type=int, nargs="*", default=list(LENGTHS))
    parser.add_argument("--dtypes", nargs="*", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--cuda-methods", "--methods", dest="methods", nargs="*",
                        default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--check-seq", type=int, default=256, help="S of the correctness check")
    parser.add_argument("--write-choices", action="store_true",
                        help="record the faster of Triton / Flex per shape for attend")
    parser.add_argument("--out-dir", default=str(Path(__file__).resolve().parent / "results"))
    args, ignored = parser.parse_known_args(argv)
    if ignored:  # the CPU benchmark's own options (--quick, --threads, ...)
        print(f"ignored on cuda: {' '.join(ignored)}", file=sys.stderr)
    if not args.seq:
        args.seq = list(LENGTHS)
    return args


def main(argv: list[str] | None = None) -> int:
    """Exit status 1 when any row failed (the table is written all the same)."""
    args = parse(sys.argv[1:] if argv is None else argv)
    if not torch.cuda.is_available():
        raise SystemExit(NO_CUDA.format(torch.__version__))
    from attnlab.attention import cuda_table

    # every (S, dtype) compiles FlexAttention once more; past torch's limit of 8 graphs it would
    # run unfused (materialized) and this bench would time that instead
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    table, results = run(args)
    print(table)
    out = Path(args.out_dir) / f"attention-cuda-{time.strftime('%Y%m%d-%H%M%S')}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table)
    print(f"written to {out}", file=sys.stderr)
    if args.write_choices:
        choices = choices_from(results, args.head_dim)
        write_choices(choices, cuda_table.CUDA_CHOICES_FILE)
        print(f"choices {choices} written to {cuda_table.CUDA_CHOICES_FILE}", file=sys.stderr)
    return int(any("error" in r for r in results.values()))


if __name__ == "__main__":
    sys.exit(main())

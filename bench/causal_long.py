"""Every causal scheme at long lengths: forward and forward+backward time and peak memory,
as ratios to causal SDPA (or to the UNAS module) in the same run.

    PYTHONPATH=src:. python bench/causal_long.py                      # S = 1024, 2048, 4096
    PYTHONPATH=src:. python bench/causal_long.py --seq 4096 --schemes sigmoid sink softpick
    # before / after: the same schemes from two source trees, interleaved in one run
    PYTHONPATH=src:. python bench/causal_long.py --src /tmp/before/src src --schemes sigmoid

B=1, H=12, d=64, float32, `torch.set_num_threads(--threads)` (2). The schemes are the registry's
causal ones (`attnlab.attention.schemes.fitting(causal=True)`: none that normalizes over queries)
plus each `model.gate`:
- normalizers run as `attend(q, k, v, scheme, causal=True)` on (B, H, S, d) q, k, v, against
  `F.scaled_dot_product_attention(q, k, v, is_causal=True)` ("sdpa");
- logit transforms (coda, realformer, selective), head schemes (diff) and the output gates run as
  `MultiHeadAttention(H d, H, spec=...)(x, causal=True)` on x (B, S, H d), against the same module
  with `unas` ("unas module"), projections included.
Each (scheme, S, source) runs in a fresh subprocess, in --rounds interleaved rounds (every scheme
once per round; --repeats timed runs each after a warm-up at S = 64), as bench/attention.py does:
on a machine shared with others, wall time follows their load, CPU time (user + system of the
process) counts only the time it ran; the table gives the median (--stat min: the least disturbed
run) of both. Peak memory is the process's ru_maxrss after the timed runs minus its ru_maxrss
before them (after the warm-up and the inputs), i.e. what the scheme's fwd+bwd added at its peak;
The peak memory comes from a second worker per run (one fwd and one fwd+bwd) with glibc's mmap
threshold fixed (MALLOC_MMAP_THRESHOLD_, --mmap-threshold, 8 MiB): glibc otherwise raises it to
the size of each large block freed, after which those blocks come from the heap, whose
high-water mark depends on the order of allocations: the same diff fwd+bwd at S = 4096 measured
0.20-0.25 GiB in four runs with the defaults, 0.153 GiB each time with the threshold fixed (the
baseline: 0.156 and 0.129). Fixed, blocks of 8 MiB and more are mapped and returned when freed,
so that "peak" is what the step holds at once, for every row alike. The times come from the
first worker, with glibc's defaults, since a fixed threshold makes every large block a fresh
mapping whose pages fault in (selective's 8 MiB blocks took 1.4x longer so). --mmap-threshold 0:
one worker, glibc's defaults for both.
"S x S" says whether that is at least one (B, H, S, S) float32 map more than the baseline's
(at S = 1024 a map, 48 MiB, is near the noise of ru_maxrss; at 4096 it is 768 MiB). The route is the kernel each
normalizer call took (`Normalizer.route`: a fast path's name, or "reference"); "materialized" when
the module's scheme computes its maps itself without asking the normalizer for a kernel.
A scheme whose previous length's peak, scaled by (S / S_prev)^2, would pass --max-gib is skipped.
The Markdown table is printed and written to bench/results/causal_long-<time>.md.

FLOP floor (printed with the table): causal attention fwd+bwd, counting only matrix products:
forward QK^T and PV, backward the recomputed QK^T, dP = dO V^T, dV = P^T dO, dQ = dS K,
dK = dS^T Q: 7 products of 2 S^2 d FLOPs per (batch, head), halved by causality:
7 B H S^2 d = 2 * 2 * B H S^2 d / 2 * (1 fwd + 2.5 bwd). Each row's GFLOP/s is that floor over its
fwd+bwd CPU time (the same floor for every scheme: what it would cost done as flash attention).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

from attention import merge, time_steps, write_table  # bench/ is on the path: this script's folder

BASE_NORMALIZER, BASE_MODULE = "sdpa", "unas_module"


def flop_floor(S: int, B: int, H: int, d: int) -> float:
    """Matmul FLOPs of causal fwd+bwd done as flash attention: 7 B H S^2 d (see the docstring)."""
    return 2 * 2 * B * H * S * S * d / 2 * (1 + 2.5)


def schemes() -> dict[str, str]:
    """Every causal scheme of the registry -> its kind ("normalizer" or "module"), gates too."""
    from attnlab.attention.gate import GATES
    from attnlab.attention.schemes import NORMALIZERS, fitting

    found = {n: "normalizer" if n in NORMALIZERS else "module" for n in fitting(causal=True)}
    found.update({f"gate_{g}": "module" for g in GATES})
    return found


def module_spec(name: str):
    if name == BASE_MODULE:
        return "unas"
    if name.startswith("gate_"):
        return {"scheme": "unas", "gate": name.removeprefix("gate_")}
    return name


def run_worker(name: str, S: int, B: int, H: int, d: int, repeats: int, threads: int) -> dict:
    """Time `name` in this (fresh) process: wall and CPU seconds of fwd and fwd+bwd, peak added
    memory (GiB), the process's peak RSS (GiB) and the routes the normalizer calls took."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    from attnlab.attention import MultiHeadAttention, attend
    from attnlab.attention.kernels import fused
    from attnlab.attention.schemes.normalizer import Normalizer

    fused.load()
    routes: list[str] = []
    choose = Normalizer.choose

    def recording_choose(self, call):
        path = choose(self, call)
        routes.append("reference" if path is None else path.name)
        return path

    Normalizer.choose = recording_choose
    if name == BASE_NORMALIZER or schemes().get(name) == "normalizer":
        def inputs(length):
            torch.manual_seed(0)
            return [torch.randn(B, H, length, d, requires_grad=True) for _ in range(3)]

        if name == BASE_NORMALIZER:
            def fn(q, k, v):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            def fn(q, k, v):
                return attend(q, k, v, name, causal=True)
    else:
        torch.manual_seed(0)
        module = MultiHeadAttention(H * d, H, spec=module_spec(name))
        structure = module.head_scheme if module.head_scheme is not None else module.transform
        if hasattr(structure, "route"):
            # a transform with its own kernel (selective's "blocks") asks no normalizer: its
            # `route` names what ran (diff's names its normalizer's paths, recorded anyway)
            own_route = type(structure).route

            def recording_route(self, normalizer, heads):
                found = own_route(self, normalizer, heads)
                routes.append(found)
                return found

            type(structure).route = recording_route

        def inputs(length):
            torch.manual_seed(0)
            return [torch.randn(B, length, H * d, requires_grad=True)]

        def fn(x):
            return module(x, causal=True)

    def forward(*tensors):
        with torch.no_grad():
            fn(*tensors)

    def forward_backward(*tensors):
        out = fn(*tensors)
        out.backward(torch.ones_like(out))

    small = inputs(min(S, 64))  # warm up kernels, threads and allocator
    forward(*small)
    forward_backward(*small)
    del small
    tensors = inputs(S)
    routes.clear()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    result = time_steps({"fwd": forward, "fwdbwd": forward_backward}, tensors, repeats)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result["peak_gib"] = (after - before) / 2**20
    result["rss_gib"] = after / 2**20
    # torch's own SDPA asks no normalizer; a module scheme that asked none computed its maps itself
    result["route"] = "+".join(dict.fromkeys(routes)) or (
        "torch sdpa" if name == BASE_NORMALIZER else "materialized")
    return result


def run_worker_process(name: str, S: int, src: str, args, repeats: int,
                       mmap_threshold: int = 0) -> dict:
    cmd = [sys.executable, __file__, "--worker", name, "--seq", str(S), "--batch", str(args.batch),
           "--heads", str(args.heads), "--head-dim", str(args.head_dim),
           "--repeats", str(repeats), "--threads", str(args.threads)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    if mmap_threshold:
        env["MALLOC_MMAP_THRESHOLD_"] = str(mmap_threshold)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["killed"])[-1][:80]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_config(name: str, S: int, src: str, args) -> dict:
    """The times from a worker with glibc's defaults; with --mmap-threshold, the peak memory from
    a second worker (one fwd and one fwd+bwd) with the threshold fixed (see the docstring)."""
    timed = run_worker_process(name, S, src, args, args.repeats)
    if "error" in timed or not args.mmap_threshold:
        return timed
    memory = run_worker_process(name, S, src, args, 1, args.mmap_threshold)
    if "error" in memory:
        return memory
    return {**timed, "peak_gib": memory["peak_gib"], "rss_gib": memory["rss_gib"]}


def summarize(runs: list[dict], stat: str) -> dict:
    """bench/attention.py's merge (median or min of the times, max of the peak), plus the largest
    RSS and the routes seen."""
    merged = merge(runs, stat)
    if "error" not in merged:
        merged["rss_gib"] = max(r["rss_gib"] for r in runs)
        merged["route"] = "/".join(dict.fromkeys(r["route"] for r in runs))
    return merged


def row(S: int, label: str, res: dict, base: dict, map_gib: float, floor: float) -> str:
    if "error" in res or "skipped" in res:
        return f"| {S} | {label} | {res.get('skipped') or res['error']} | | | | | |"

    def timed(key):
        return (f"{res[key]:.3f} s ({res[key] / base[key]:.2f}x); "
                f"cpu {res[key + '_cpu'] / base[key + '_cpu']:.2f}x")

    peak = res["peak_gib"]
    ratio = peak / base["peak_gib"] if base["peak_gib"] > 0 else float("nan")
    gflops = floor / res["fwdbwd_cpu"] / 1e9
    return (f"| {S} | {label} | {res['route']} | {timed('fwd')} | {timed('fwdbwd')} | "
            f"{peak:.3f} GiB ({ratio:.2f}x); rss {res['rss_gib']:.2f} GiB | "
            f"{'yes' if peak - base['peak_gib'] >= map_gib else 'no'} | {gflops:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq", type=int, nargs="*", default=[1024, 2048, 4096])
    parser.add_argument("--schemes", nargs="*", help="default: every causal scheme of the registry")
    parser.add_argument("--src", nargs="*", default=[],
                        help="source trees to import attnlab from, each timed in the same rounds "
                             "(default: the attnlab this process imports); the baselines run from "
                             "the first")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per subprocess")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved subprocess rounds")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--stat", default="median", choices=["median", "min"])
    parser.add_argument("--mmap-threshold", type=int, default=8 << 20,
                        help="glibc's MALLOC_MMAP_THRESHOLD_ (bytes) in the workers; 0: glibc's "
                             "default, a dynamic threshold (see the docstring)")
    parser.add_argument("--max-gib", type=float, default=8.0,
                        help="skip a scheme whose peak, scaled from the previous S, would pass this")
    parser.add_argument("--out-dir", default=str(Path(__file__).resolve().parent / "results"))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        print(json.dumps(run_worker(args.worker, args.seq[0], args.batch, args.heads,
                                    args.head_dim, args.repeats, args.threads)))
        return

    import attnlab

    sources = [str(Path(s).resolve()) for s in args.src] or [
        str(Path(attnlab.__file__).resolve().parents[1])]
    known = schemes()
    wanted = args.schemes or list(known)
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise SystemExit(f"not causal schemes of the registry: {', '.join(unknown)}; "
                         f"choose from {', '.join(known)}")
    for src in sources:  # build each tree's kernel here, not inside a timed worker
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
        build = "from attnlab.attention.kernels import fused; fused.load()"
        subprocess.run([sys.executable, "-c", build], env=env, check=True)
    bases = [BASE_NORMALIZER] if any(known[n] == "normalizer" for n in wanted) else []
    bases += [BASE_MODULE] if any(known[n] == "module" for n in wanted) else []
    configs = [(b, sources[0]) for b in bases] + [(n, s) for n in wanted for s in sources]

    def label(name, src):
        kind = {BASE_NORMALIZER: "causal SDPA (baseline)", BASE_MODULE: "unas module (baseline)"}
        text = kind.get(name) or (f"{name} (attend)" if known[name] == "normalizer"
                                  else f"{name} (module)")
        return f"{text} [{src}]" if len(sources) > 1 and name not in kind else text

    rows, last_peak = [], {}
    for S in args.seq:
        runs: dict[tuple, list] = {c: [] for c in configs}
        skipped = {}
        for c in configs:
            if c in last_peak:
                prev_S, prev_gib = last_peak[c]
                est = prev_gib * (S / prev_S) ** 2
                if est > args.max_gib:
                    skipped[c] = {"skipped": f"skipped (~{est:.1f} GiB > --max-gib)"}
        for _ in range(args.rounds):
            for c in configs:
                if c not in skipped:
                    runs[c].append(run_config(c[0], S, c[1], args))
                    print(f"S={S} {label(*c)}: {runs[c][-1]}", file=sys.stderr, flush=True)
        results = {c: skipped.get(c) or summarize(runs[c], args.stat) for c in configs}
        map_gib = args.batch * args.heads * S * S * 4 / 2**30
        floor = flop_floor(S, args.batch, args.heads, args.head_dim)
        for c in configs:
            res = results[c]
            if "peak_gib" in res:
                last_peak[c] = (S, res["peak_gib"])
            kind = BASE_NORMALIZER if c[0] == BASE_NORMALIZER or known.get(c[0]) == "normalizer" \
                else BASE_MODULE
            base = results[(kind, sources[0])]
            if "error" in base:
                raise SystemExit(f"the baseline {kind} failed at S={S}: {base['error']}")
            rows.append(row(S, label(*c), res, base, map_gib, floor))
            print(rows[-1], file=sys.stderr, flush=True)
    floors = ", ".join(f"S={S}: {flop_floor(S, args.batch, args.heads, args.head_dim) / 1e9:.1f}"
                       for S in args.seq)
    header = (
        f"Causal attention, B={args.batch}, H={args.heads}, d={args.head_dim}, float32, "
        f"{args.threads} threads, {args.stat} of {args.rounds} interleaved rounds x {args.repeats} "
        f"runs; wall time (ratio) and CPU-time ratio to the baseline of the same S in this run "
        f"(normalizers: causal SDPA; modules: MultiHeadAttention({args.heads * args.head_dim}, "
        f"{args.heads}) with unas); peak = ru_maxrss added by the timed fwd and fwd+bwd (ratio "
        f"to the baseline's; glibc mmap threshold "
        f"{args.mmap_threshold or 'dynamic (default)'}), rss = the process's whole peak; "
        f"S x S = peak >= the baseline's + one "
        f"(B, H, S, S) float32 map.\nFLOP floor (causal fwd+bwd as flash attention, matmuls only, 7 B H S^2 d "
        f"= 2*2*B*H*S^2*d/2 * (1 fwd + 2.5 bwd)), GFLOP: {floors}; GFLOP/s = floor / fwd+bwd CPU "
        f"time (divide by {args.threads} threads for one core's).\nSources: {', '.join(sources)}\n\n"
        "| S | scheme | route | forward | forward+backward | peak memory | S x S | GFLOP/s |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    write_table(header + "\n" + "\n".join(rows) + "\n", args, "causal_long")


if __name__ == "__main__":
    main()

"""Benchmark of the attention schemes: forward and forward+backward time, peak memory.

    python bench/attention.py            # S in 128, 512, 1024, 2048, 4096 (several minutes)
    python bench/attention.py --quick    # S in 128, 512
    python bench/attention.py --methods unas_sdpa unas_dropout_fused unas_dropout_sdpa \
        unas_dropout_reference dnas_dropout_fused hnas_dropout_fused --seq 512 1024
    python bench/attention.py --device cuda   # bf16 + fp32, S up to 16384 (bench/attention_cuda.py)

B=8, H=12, d=64, float32, `torch.set_num_threads(--threads)`. Each (method, S) runs in a fresh
subprocess so that its peak memory (ru_maxrss of the child) is its own. On a shared machine wall
time follows the load of the moment, so the subprocesses of one S run in --rounds interleaved
rounds (every method once per round, --repeats timed runs each after a small warm-up) and the
table gives the median (--stat min: the least disturbed run) over all runs, of wall time and of
CPU time (the process's user + system time, which counts only the time it actually ran). Every
ratio is to UNAS-SDPA of the same run. WORK_PER_SCORE (printed with the table) counts each
path's matrix products and exponentials per score against flash's.
Materialized methods whose S x S tensors would not fit --max-materialized-gib are skipped.
The Markdown table is printed and written to bench/results/attention-<time>.md.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

METHODS = {
    "unas_sdpa": "UNAS via SDPA",
    "unas_naive": "UNAS naive (materialized)",
    "dnas_reference": "DNAS reference (materialized)",
    "hnas_reference": "HNAS reference (materialized)",
    "dnas_efficient": "DNAS efficient (fused kernel)",
    "hnas_efficient": "HNAS efficient (fused kernel)",
    "dnas_composed": "DNAS composed flash (fallback)",
    "hnas_composed": "HNAS composed flash (fallback)",
    # key and query padding (item b of the batch: its last b S / 32 positions padded)
    "unas_padded_attend": "UNAS padded, attend (fused kernel)",
    "unas_padded_sdpa": "UNAS padded, bare SDPA (key mask only)",
    # attention dropout 0.1 (training): the paths attend takes, and the alternatives
    "unas_dropout_fused": "UNAS dropout 0.1, fused kernel (attend)",
    "unas_dropout_sdpa": "UNAS dropout 0.1, SDPA (math backend)",
    "unas_dropout_reference": "UNAS dropout 0.1, reference",
    "dnas_dropout_fused": "DNAS dropout 0.1, fused kernel (attend)",
    "hnas_dropout_fused": "HNAS dropout 0.1, fused kernel (attend)",
    "hnas_dropout_reference": "HNAS dropout 0.1, reference",
    # row-wise schemes (their CPU fast paths, through attend; b / c per head with a gradient)
    "sigmoid_fused": "sigmoid, b = -log n (fused row-wise kernel)",
    "sigmoid_learned_fused": "sigmoid, learned b (fused row-wise kernel)",
    "sink_fused": "sink, learned b (fused row-wise kernel)",
    "sink_sdpa_key": "sink as an extra key through SDPA (b fixed, alternative)",
    "softpick_fused": "softpick (fused row-wise kernel)",
    "ssmax_scaled": "SSMax, learned c (UNAS-SDPA on scaled q)",
    "sigmoid_reference": "sigmoid reference (materialized)",
    # ESPFormer: L = d sliced plans, O(L S^3) time (not in the default set: run with --methods)
    "mha_unas": "MultiHeadAttention, UNAS (projections included)",
    "mha_unas_causal": "MultiHeadAttention, UNAS, causal",
    "mha_gate_headwise": "MultiHeadAttention, UNAS + headwise output gate",
    "mha_gate_elementwise": "MultiHeadAttention, UNAS + elementwise output gate",
    "mha_diff": "MultiHeadAttention, differential attention v1",
    "mha_diff_v2": "MultiHeadAttention, differential attention v2",
    "mha_selective": "MultiHeadAttention, selective attention (causal)",
    "esp_chunked": "ESP, chunked over slices (attend)",
    "esp_reference": "ESP reference (all L plans materialized)",
}
ROWWISE = ("sigmoid_fused", "sigmoid_learned_fused", "sink_fused", "sink_sdpa_key",
           "softpick_fused", "ssmax_scaled")
DEFAULT_METHODS = [m for m in METHODS if "dropout" not in m and m not in ROWWISE
                   and m != "sigmoid_reference"]
# The fallback without a C++ compiler: attend() with the fused kernel switched off.
COMPOSED = ("dnas_composed", "hnas_composed")
# Rough number of live (B, H, S, S) float32 tensors at the peak of fwd+bwd, for skipping.
MATERIALIZED_COPIES = {"unas_naive": 4, "dnas_reference": 7, "hnas_reference": 10,
                       "unas_dropout_sdpa": 4, "unas_dropout_reference": 6,
                       "hnas_dropout_reference": 11, "sigmoid_reference": 5}
# ESPFormer (O(L S^3) per head) and the whole-module measurements of the structural schemes:
# asked for by name (--methods), not in the default run
DEFAULT_METHODS = [m for m in DEFAULT_METHODS if not m.startswith(("esp_", "mha_"))]
MATERIALIZED_COPIES["esp_reference"] = 4 * 64  # plans, soft sorts, their gradients, per slice
# Work per score (one query-key pair) of each path, as (B, H, S, S)-sized matrix products of
# inner size d (2 d FLOPs each) and exponentials, forward / backward; the backward includes the
# scores it recomputes. Matmuls alone give each path's floor against flash (7): DNAS 8/7 =
# 1.14x, HNAS 9/7 = 1.29x; the extra exponential adds to it (at d = 64 on a CPU an exponential
# costs a noticeable fraction of a d-length product).
WORK_PER_SCORE = """\
| path | forward | backward | total | floor vs flash (matmuls) |
|---|---|---|---|---|
| flash (SDPA, UNAS) | 2 mm + 1 exp | 5 mm + 1 exp | 7 mm + 2 exp | 1 |
| DNAS fused | 3 mm + 2 exp | 5 mm + 1 exp | 8 mm + 3 exp | 1.14x |
| HNAS fused | 4 mm + 2 exp | 5 mm + 1 exp | 9 mm + 3 exp | 1.29x |
| UNAS padded, attend (fused) | 2 mm + 1 exp | 5 mm + 1 exp | 7 mm + 2 exp | 1 |
| sigmoid / sink / softpick fused (row-wise) | 2 mm + 1 exp | 5 mm + 1 exp | 7 mm + 2 exp | 1 |
| SSMax (UNAS on scaled q) | 2 mm + 1 exp | 5 mm + 1 exp | 7 mm + 2 exp | 1 |

mm: flash fwd QK^T, PV; bwd QK^T, dP = g V^T, dV = P^T g, dQ = dS K, dK = dS^T Q. DNAS adds the
column pass (KQ^T, column LSE) in the forward; its backward runs over blocks of keys against
every query, so the column sums behind the gradient through the column LSE are complete in a
block and the backward's products are flash's five (csrc/backward.h). HNAS's P V product has
twice the width ([V | b V]: both branches' outputs, whose row sums g . O the backward needs;
the forward timed alone, without gradients, mixes the weights before one P V product: 3 mm),
and it gets its UNAS weights from the DNAS ones without an exp (Pu = Pd a_i b_j, csrc/fold.h).
Before (two query-block passes in the backward): DNAS 3 + 6, HNAS 3 + 7 mm, 4 exp each.
Row-wise schemes (csrc/rowwise.cpp): flash's products and one exponential per score each way
(sigmoid as exp(-|t|); softpick's and the sink's backward need no extra product: D_i = g_i .
out_i); SSMax adds an O(S d) scaling of q to flash; the sink as an extra key runs flash on S + 1
keys (and a copy of K and V).
"""
FULL_LENGTHS = (128, 512, 1024, 2048, 4096)
QUICK_LENGTHS = (128, 512)


def run_worker(method: str, S: int, B: int, H: int, d: int, repeats: int, threads: int) -> dict:
    """Time one method in this (fresh) process: lists of wall and CPU seconds, peak RSS in GiB."""
    import os

    if method in COMPOSED:
        os.environ["ATTNLAB_FUSED_KERNEL"] = "0"
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    from attnlab.attention import attend, reference_attend
    from attnlab.attention.kernels import fused

    if ("efficient" in method or "fused" in method or "ssmax" in method) and not fused.load():
        raise SystemExit("the fused kernel did not build (see the warning above)")

    def unas_naive(q, k, v):
        w = torch.softmax(q @ k.transpose(-2, -1) / d**0.5, dim=-1)
        return w @ v

    methods = {
        "unas_sdpa": lambda q, k, v, u: F.scaled_dot_product_attention(q, k, v),
        "unas_naive": lambda q, k, v, u: unas_naive(q, k, v),
        "dnas_reference": lambda q, k, v, u: reference_attend(q, k, v, "dnas"),
        "hnas_reference": lambda q, k, v, u: reference_attend(q, k, v, "hnas", u=u),
        "dnas_efficient": lambda q, k, v, u: attend(q, k, v, "dnas"),
        "hnas_efficient": lambda q, k, v, u: attend(q, k, v, "hnas", u=u),
        "dnas_composed": lambda q, k, v, u: attend(q, k, v, "dnas"),
        "hnas_composed": lambda q, k, v, u: attend(q, k, v, "hnas", u=u),
        "unas_padded_attend": lambda q, k, v, u: attend(q, k, v, "unas", padded(q.shape[-2])[0],
                                                        padded(q.shape[-2])[0]),
        "unas_padded_sdpa": lambda q, k, v, u: F.scaled_dot_product_attention(
            q, k, v, attn_mask=padded(q.shape[-2])[1]),
        "unas_dropout_fused": lambda q, k, v, u: attend(q, k, v, "unas", dropout_p=0.1),
        "unas_dropout_sdpa": lambda q, k, v, u: F.scaled_dot_product_attention(q, k, v,
                                                                               dropout_p=0.1),
        "unas_dropout_reference": lambda q, k, v, u: reference_attend(q, k, v, "unas",
                                                                      dropout_p=0.1),
        "dnas_dropout_fused": lambda q, k, v, u: attend(q, k, v, "dnas", dropout_p=0.1),
        "hnas_dropout_fused": lambda q, k, v, u: attend(q, k, v, "hnas", u=u, dropout_p=0.1),
        "hnas_dropout_reference": lambda q, k, v, u: reference_attend(q, k, v, "hnas", u=u,
                                                                      dropout_p=0.1),
    }
    def sink_sdpa_key(q, k, v, b):
        """The sink as one more key (score 0, value 0) with the additive bias b_h on it."""
        zero = q.new_zeros(B, H, 1, d)
        bias = torch.zeros(1, H, 1, q.shape[-2] + 1)
        bias[..., -1] = b.detach().view(1, H, 1)
        return F.scaled_dot_product_attention(q, torch.cat([k, zero], 2), torch.cat([v, zero], 2),
                                              attn_mask=bias)

    methods.update({
        "sigmoid_fused": lambda q, k, v, u: attend(q, k, v, "sigmoid"),
        "sigmoid_learned_fused": lambda q, k, v, u: attend(q, k, v, "sigmoid", bias="learned", b=u),
        "sink_fused": lambda q, k, v, u: attend(q, k, v, "sink", b=u),
        "sink_sdpa_key": sink_sdpa_key,
        "softpick_fused": lambda q, k, v, u: attend(q, k, v, "softpick"),
        "ssmax_scaled": lambda q, k, v, u: attend(q, k, v, "ssmax", c=u),
        "sigmoid_reference": lambda q, k, v, u: reference_attend(q, k, v, "sigmoid"),
        "esp_chunked": lambda q, k, v, u: attend(q, k, v, "esp"),
        "esp_reference": lambda q, k, v, u: reference_attend(q, k, v, "esp"),
    })

    # Structural schemes act on a whole attention module (projections, gate, paired maps), so
    # they are timed as MultiHeadAttention(E = H d) self-attention on x = q's heads side by side,
    # against the same module with UNAS (mha_unas; mha_unas_causal for selective attention).
    modules = {"mha_unas": ("unas", False), "mha_unas_causal": ("unas", True),
               "mha_gate_headwise": ({"scheme": "unas", "gate": "headwise"}, False),
               "mha_gate_elementwise": ({"scheme": "unas", "gate": "elementwise"}, False),
               "mha_diff": ("diff", False), "mha_diff_v2": ({"scheme": "diff", "version": 2}, False),
               "mha_selective": ("selective", True)}

    def module_method(spec, causal):
        from attnlab.attention import MultiHeadAttention

        torch.manual_seed(0)
        m = MultiHeadAttention(H * d, H, spec=spec)

        def run(q, k, v, u):
            x = q.transpose(1, 2).reshape(B, q.shape[-2], H * d)
            return m(x, causal=causal).view(B, q.shape[-2], H, d).transpose(1, 2)
        return run

    if method in modules:
        methods[method] = module_method(*modules[method])
    fn = methods[method]

    def inputs(length):
        torch.manual_seed(0)
        q, k, v = (torch.randn(B, H, length, d, requires_grad=True) for _ in range(3))
        u = torch.full((1, H, 1, 1), 0.5, requires_grad=True)
        return q, k, v, u

    def padding(length):
        """Item b of the batch has its last b * length // 32 positions padded (item 0 none)."""
        mask = torch.zeros(B, length, dtype=torch.bool)
        for b in range(B):
            mask[b, length - b * length // 32:] = True
        return mask

    masks = {}  # per length: (key padding = query padding, SDPA's bool mask, True = attend)

    def padded(length):
        if length not in masks:
            mask = padding(length)
            masks[length] = (mask, ~mask[:, None, None, :])
        return masks[length]

    def forward(q, k, v, u):
        with torch.no_grad():
            fn(q, k, v, u)

    def forward_backward(q, k, v, u):
        fn(q, k, v, u).backward(torch.ones(B, H, q.shape[-2], d))

    # Warm up kernels, threads and allocator on a small problem, then time the real one.
    small = inputs(min(S, 64))
    forward(*small)
    forward_backward(*small)
    del small
    tensors = inputs(S)
    result = time_steps({"fwd": forward, "fwdbwd": forward_backward}, tensors, repeats)
    # ru_maxrss is in KiB on Linux.
    result["peak_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return result


def run_config(method: str, S: int, args) -> dict:
    cmd = [
        sys.executable, __file__, "--worker", method, "--seq", str(S), "--batch", str(args.batch),
        "--heads", str(args.heads), "--head-dim", str(args.head_dim),
        "--repeats", str(args.repeats), "--threads", str(args.threads),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["killed"])[-1][:80]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def time_steps(steps: dict, tensors: list, repeats: int) -> dict:
    """{name: wall seconds of each of `repeats` runs, name_cpu: CPU seconds (user + system of
    the process)} of each step on `tensors`, their gradients cleared after each run."""
    result = {}
    for name, step in steps.items():
        wall, cpu = [], []
        for _ in range(repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            step(*tensors)
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            for x in tensors:
                x.grad = None
        result[name], result[name + "_cpu"] = wall, cpu
    return result


def merge(runs: list[dict], stat: str = "median") -> dict:
    """Median (or min: on a loaded machine, the run least slowed by others) over all timed runs
    of all rounds; peak memory: the largest."""
    if any("error" in r for r in runs):
        return next(r for r in runs if "error" in r)
    reduce = min if stat == "min" else statistics.median
    merged = {key: reduce([x for r in runs for x in r[key]])
              for key in ("fwd", "fwd_cpu", "fwdbwd", "fwdbwd_cpu")}
    merged["peak_gib"] = max(r["peak_gib"] for r in runs)
    return merged


def cell(res: dict, base: dict, key: str) -> str:
    if "error" in res or "skipped" in res:
        return res.get("skipped") or res["error"]
    if key == "peak_gib":
        return f"{res[key]:.2f} GiB ({res[key] / base[key]:.2f}x)"
    wall, cpu = res[key], res[key + "_cpu"]
    return f"{wall:.3f} s ({wall / base[key]:.2f}x); cpu {cpu / base[key + '_cpu']:.2f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="only S in 128, 512")
    parser.add_argument("--seq", type=int, nargs="*", help="sequence lengths (overrides --quick)")
    parser.add_argument("--methods", nargs="*", default=DEFAULT_METHODS, choices=list(METHODS))
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--write-choices", action="store_true", help="cuda only: see attention_cuda.py")
    parser.add_argument("--dtypes", nargs="*", default=["bf16", "fp32"], choices=["bf16", "fp32"],
                        help="cuda only")
    parser.add_argument("--cuda-methods", nargs="*", help="cuda only (default: all of them)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per subprocess")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved subprocess rounds")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--stat", default="median", choices=["median", "min"],
                        help="over all timed runs (min: on a machine loaded by others)")
    parser.add_argument("--max-materialized-gib", type=float, default=8.0)
    parser.add_argument("--out-dir", default=str(Path(__file__).resolve().parent / "results"))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        S = args.seq[0]
        res = run_worker(args.worker, S, args.batch, args.heads, args.head_dim, args.repeats, args.threads)
        print(json.dumps(res))
        return

    if args.device == "cuda":  # its own options and table: bench/attention_cuda.py
        import attention_cuda
        return attention_cuda.main(sys.argv[1:])
    from attnlab.attention.kernels import fused

    fused.load()  # build the kernel once here, not inside a timed worker
    lengths = args.seq or (QUICK_LENGTHS if args.quick else FULL_LENGTHS)
    methods = ["unas_sdpa"] + [m for m in args.methods if m != "unas_sdpa"]
    rows = []
    for S in lengths:
        runs: dict[str, list] = {m: [] for m in methods}
        skipped = {}
        for method in methods:
            copies = MATERIALIZED_COPIES.get(method, 0)
            est = copies * args.batch * args.heads * S * S * 4 / 2**30
            if est > args.max_materialized_gib:
                skipped[method] = {"skipped": f"skipped (~{est:.0f} GiB)"}
        for _ in range(args.rounds):
            for method in methods:
                if method not in skipped:
                    runs[method].append(run_config(method, S, args))
                    print(f"S={S} {method}: {runs[method][-1]}", file=sys.stderr, flush=True)
        results = {m: skipped.get(m) or merge(runs[m], args.stat) for m in methods}
        base = results["unas_sdpa"]
        if "error" in base:
            raise SystemExit(f"UNAS-SDPA failed at S={S}: {base['error']}")
        for method in methods:
            res = results[method]
            rows.append(
                f"| {S} | {METHODS[method]} | {cell(res, base, 'fwd')} | "
                f"{cell(res, base, 'fwdbwd')} | {cell(res, base, 'peak_gib')} |"
            )
            print(rows[-1], file=sys.stderr, flush=True)  # each row as soon as it is known
    header = (
        f"B={args.batch}, H={args.heads}, d={args.head_dim}, float32, {args.threads} threads, "
        f"{args.stat} of {args.rounds} interleaved rounds x {args.repeats} runs; wall time (ratio) and "
        f"CPU-time ratio, both to UNAS-SDPA of the same S in this run; "
        f"peak = max RSS of the fresh process (fwd+bwd)\n\n{WORK_PER_SCORE}\n"
        "| S | method | forward | forward+backward | peak memory |\n|---|---|---|---|---|"
    )
    write_table(header + "\n" + "\n".join(rows) + "\n", args, "attention")


def write_table(table: str, args, name: str) -> None:
    print(table)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.md"
    path.write_text(table)
    print(f"written to {path}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())  # the CUDA bench's status: 1 when a row failed

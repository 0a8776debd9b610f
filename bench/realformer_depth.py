"""RealFormer deep in a causal stack: fwd+bwd of layer l, its previous layers' logits handed in,
as ratios to the UNAS module in the same run (bench/causal_long.py measures the first layer only).

    PYTHONPATH=src:. python bench/realformer_depth.py                    # S = 2048, 4096; l = 1, 2, 4, 12
    PYTHONPATH=src:. python bench/realformer_depth.py --seq 4096 --layers 12

`MultiHeadAttention(H d, H, spec="realformer")(x, causal=True)` on x (B, S, H d), B=1, H=12, d=64,
float32, 2 threads, two ways:
- "stacked": the O(S) route: the previous l - 1 layers' queries and keys handed in (`StackedScores`,
  (B, H, S, (l - 1) d) each), the layer attends through the normalizer's fast path on the
  concatenation;
- "materialized": the (B, H, S, S) summed logits handed in as a tensor (what a stack carried
  before): the materialized cascade.
Both against `MultiHeadAttention(..., spec="unas")` ("unas module"). Each row runs in a fresh
subprocess; time is the median CPU time (user + system) of --repeats fwd+bwd runs, peak memory
the process's ru_maxrss after them minus before (the inputs, previous logits included, already
allocated). FLOP floor (printed): layer l of the stacked route does l q.k products, so its causal
fwd+bwd matrix products are (5 l + 2) B H S^2 d (QK^T, its recomputation and dQ, dK scale with l;
PV, dP and dV do not) against the module's 7 B H S^2 d: (5 l + 2) / 7 is the ratio a perfect
kernel would show. The table goes to bench/results/realformer_depth-<time>.md.
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

B, H, D = 1, 12, 64


def worker(variant: str, S: int, layers: int, repeats: int, threads: int) -> dict:
    import torch

    from attnlab.attention import MultiHeadAttention
    from attnlab.attention.schemes.realformer import StackedScores

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    later = variant != "unas" and layers > 1
    module = MultiHeadAttention(H * D, H, spec="unas" if variant == "unas" else "realformer",
                                layer_index=1 if later else 0)

    def previous(length: int):
        if not later:
            return None
        if variant == "stacked":
            q, k = (torch.randn(B, H, length, (layers - 1) * D, requires_grad=True) for _ in range(2))
            return StackedScores(q, k, D)
        return torch.randn(B, H, length, length, requires_grad=True)

    def step(x, prev):
        out = module(x, causal=True, prev_logits=prev)
        out.backward(torch.ones_like(out))

    small = torch.randn(B, 64, H * D, requires_grad=True)
    step(small, previous(64))  # warm up kernels, threads and allocator
    x = torch.randn(B, S, H * D, requires_grad=True)
    prev = previous(S)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cpu = []
    for _ in range(repeats):
        c0 = time.process_time()
        step(x, prev)
        cpu.append(time.process_time() - c0)
        x.grad = None
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"cpu_s": statistics.median(cpu), "peak_gib": (after - before) / 2**20}


def run(variant: str, S: int, layers: int, args) -> dict:
    cmd = [sys.executable, __file__, "--worker", variant, "--seq", str(S), "--layers", str(layers),
           "--repeats", str(args.repeats), "--threads", str(args.threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["killed"])[-1][:80]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, nargs="+", default=[2048, 4096])
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 2, 4, 12])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--worker", choices=["unas", "stacked", "materialized"])
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.seq[0], args.layers[0], args.repeats, args.threads)))
        return
    rows = ["| S | layer l | route | fwd+bwd CPU time | peak memory | floor (5l+2)/7 |", "|---|---|---|---|---|---|"]
    for S in args.seq:
        base = run("unas", S, 1, args)
        rows.append(f"| {S} | — | unas module | {base['cpu_s']:.2f} s | {base['peak_gib']:.3f} GiB | 1 |")
        for layers in args.layers:
            for variant in ("stacked", "materialized"):
                if variant == "materialized" and layers == 1:
                    continue  # the first layer has no previous logits: the stacked route alone
                r = run(variant, S, layers, args)
                if "error" in r:
                    rows.append(f"| {S} | {layers} | {variant} | {r['error']} | | |")
                    continue
                floor = (5 * layers + 2) / 7 if variant == "stacked" else 1.0
                rows.append(f"| {S} | {layers} | {variant} | {r['cpu_s'] / base['cpu_s']:.2f}x | "
                            f"{r['peak_gib'] / max(base['peak_gib'], 1e-9):.2f}x ({r['peak_gib']:.3f} GiB) | "
                            f"{floor:.2f} |")
            print(rows[-1], flush=True)
    table = "\n".join(rows)
    print(table)
    out = Path(__file__).parent / "results" / f"realformer_depth-{time.strftime('%Y-%m-%d_%H-%M-%S')}.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text(f"`{' '.join(sys.argv)}`, B={B}, H={H}, d={D}, {args.threads} threads\n\n{table}\n")


if __name__ == "__main__":
    main()

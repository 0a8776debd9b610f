"""The CUDA half of bench/attention.py (`python bench/attention.py --device cuda`).

B=8, H=12, d=64, bf16 and fp32, S in 1024 ... 8192. Every method runs in this one process:
after a warm-up (Triton compiles then), --repeats timed runs each of forward and forward +
backward, synchronized, median; peak memory = torch.cuda.max_memory_allocated() during
forward + backward (inputs and gradients included). Ratios are to UNAS through SDPA (flash +
memory-efficient backends only) of the same S and dtype in this run. Materialized methods whose
S x S tensors would not fit --max-materialized-gib are skipped.
"""

from __future__ import annotations

import statistics
import time

import torch

LENGTHS = (1024, 2048, 4096, 8192)
METHODS = {
    "unas_sdpa": "UNAS SDPA (flash / mem-efficient)",
    "dnas_triton": "DNAS Triton",
    "hnas_triton": "HNAS Triton",
    "dnas_triton_dropout": "DNAS Triton, dropout 0.1",
    "hnas_triton_dropout": "HNAS Triton, dropout 0.1",
    "unas_sdpa_dropout": "UNAS SDPA, dropout 0.1",
    "unas_naive": "UNAS naive (materialized)",
    "dnas_reference": "DNAS reference (materialized)",
    "hnas_reference": "HNAS reference (materialized)",
}
DEVICE = "cuda"  # (a smoke test of this code on a machine without GPU swaps it)
# live (B, H, S, S) float32 tensors at the peak of fwd+bwd, for skipping
MATERIALIZED_COPIES = {"unas_naive": 4, "dnas_reference": 7, "hnas_reference": 10}


def _methods(d: int):
    from attnlab.attention import attend
    from attnlab.attention.kernels import sdpa
    from attnlab.attention.reference import reference_attend

    def unas_naive(q, k, v, u):
        return torch.softmax((q @ k.transpose(-2, -1)).float() / d**0.5, dim=-1).to(v.dtype) @ v

    return {
        "unas_sdpa": lambda q, k, v, u: sdpa.unas_sdpa(q, k, v),
        "unas_sdpa_dropout": lambda q, k, v, u: sdpa.unas_sdpa(q, k, v, dropout_p=0.1),
        "dnas_triton": lambda q, k, v, u: attend(q, k, v, "dnas"),
        "hnas_triton": lambda q, k, v, u: attend(q, k, v, "hnas", u=u),
        "dnas_triton_dropout": lambda q, k, v, u: attend(q, k, v, "dnas", dropout_p=0.1),
        "hnas_triton_dropout": lambda q, k, v, u: attend(q, k, v, "hnas", u=u, dropout_p=0.1),
        "unas_naive": unas_naive,
        "dnas_reference": lambda q, k, v, u: reference_attend(q, k, v, "dnas"),
        "hnas_reference": lambda q, k, v, u: reference_attend(q, k, v, "hnas", u=u),
    }


def _time(fn, repeats: int) -> float:
    runs = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def measure(method: str, S: int, dtype: torch.dtype, args) -> dict:
    fn = _methods(args.head_dim)[method]
    B, H, d = args.batch, args.heads, args.head_dim
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, S, d, device=DEVICE, dtype=dtype, requires_grad=True)
               for _ in range(3))
    u = torch.full((1, H, 1, 1), 0.5, device=DEVICE, requires_grad=True)
    grad = torch.ones(B, H, S, d, device=DEVICE, dtype=dtype)

    def forward():
        with torch.no_grad():
            fn(q, k, v, u)

    def forward_backward():
        fn(q, k, v, u).backward(grad)
        for x in (q, k, v, u):
            x.grad = None

    forward_backward()  # warm-up: Triton compiles, cuDNN / allocator settle
    result = {"fwd": _time(forward, args.repeats)}
    torch.cuda.reset_peak_memory_stats()
    result["fwdbwd"] = _time(forward_backward, args.repeats)
    result["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return result


def run(args) -> str:
    """Measure every method at every S and dtype; the Markdown table."""
    lengths = args.seq or LENGTHS
    dtypes = {"bf16": torch.bfloat16, "fp32": torch.float32}
    methods = ["unas_sdpa"] + [m for m in (args.cuda_methods or METHODS) if m != "unas_sdpa"]
    rows = []
    for name in args.dtypes:
        for S in lengths:
            results = {}
            for method in methods:
                est = MATERIALIZED_COPIES.get(method, 0) * args.batch * args.heads * S * S * 4
                if est / 2**30 > args.max_materialized_gib:
                    results[method] = {"skipped": f"skipped (~{est / 2**30:.0f} GiB)"}
                    continue
                try:
                    results[method] = measure(method, S, dtypes[name], args)
                except torch.cuda.OutOfMemoryError:
                    results[method] = {"skipped": "out of memory"}
                torch.cuda.empty_cache()
            base = results["unas_sdpa"]
            for method in methods:
                rows.append(f"| {name} | {S} | {METHODS[method]} | {_cells(results[method], base)} |")
    header = (
        f"{torch.cuda.get_device_name()}, B={args.batch}, H={args.heads}, d={args.head_dim}; "
        f"median of {args.repeats} synchronized runs after a warm-up; ratios to UNAS-SDPA of the "
        f"same dtype and S in this run; peak = torch.cuda.max_memory_allocated (fwd+bwd)\n\n"
        "| dtype | S | method | forward | forward+backward | peak memory |\n|---|---|---|---|---|---|"
    )
    return header + "\n" + "\n".join(rows) + "\n"


def _cells(res: dict, base: dict) -> str:
    if "skipped" in res:
        return " | ".join([res["skipped"]] * 3)
    return " | ".join(
        f"{res[key]:.4f} s ({res[key] / base[key]:.2f}x)" if key != "peak_gib"
        else f"{res[key]:.2f} GiB ({res[key] / base[key]:.2f}x)"
        for key in ("fwd", "fwdbwd", "peak_gib")
    )


def check_device() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is visible to torch here")

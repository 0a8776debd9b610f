"""End-to-end benchmark: one training step (forward + backward) of a BERT-base-width encoder per
attention scheme, with and without attention dropout, against HF `BertModel` (sdpa).

    python bench/train_step.py                     # CPU: 2 layers, B=4, S=512 (a few minutes)
    python bench/train_step.py --device cuda       # bf16 autocast, 12 layers, B=8, S=512

Models: `tasks.mlm.model.BertEncoder` (d 768, 12 heads, FFN 3072, hidden dropout 0.1) with
model=unas / dnas / hnas, and `transformers.BertModel` of the same size with
attn_implementation="sdpa" (no pooler). Loss: mean square of the last hidden states. Every
model is built once; the configurations are timed in --rounds interleaved rounds (--repeats steps
each, after --warmup) so that on a shared machine they see the same load, and the table gives
the median wall time, the median CPU time of the process (CPU) or the peak GPU memory (CUDA),
and the ratios to our UNAS and to HF with the same attention dropout, all from this one run.
The Markdown table is printed and written to bench/results/train_step-<time>.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]  # attnlab and tasks: installed (pip install -e .)

VOCAB = 30522


def build(kind: str, args, attn_dropout: float) -> torch.nn.Module:
    if kind == "hf":
        from transformers import BertConfig, BertModel

        config = BertConfig(vocab_size=VOCAB, hidden_size=args.width, num_hidden_layers=args.layers,
                            num_attention_heads=args.heads, intermediate_size=4 * args.width,
                            max_position_embeddings=max(512, args.seq), hidden_dropout_prob=0.1,
                            attention_probs_dropout_prob=attn_dropout)
        config._attn_implementation = "sdpa"
        return BertModel(config, add_pooling_layer=False)
    from tasks.mlm.model import BertEncoder

    return BertEncoder(VOCAB, d_model=args.width, num_layers=args.layers, nhead=args.heads,
                       dim_feedforward=4 * args.width, max_position=max(512, args.seq),
                       dropout=0.1, attn_dropout=attn_dropout, spec=kind)


def make_step(kind: str, model: torch.nn.Module, ids: torch.Tensor, padding: torch.Tensor, args):
    """A closure running one forward + backward of `model` on the batch."""
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.device == "cuda")

    def step():
        with autocast:
            if kind == "hf":
                hidden = model(input_ids=ids, attention_mask=(~padding).long()).last_hidden_state
            else:
                hidden = model(ids, padding_mask=padding)
        hidden.float().square().mean().backward()
        for p in model.parameters():
            p.grad = None

    return step


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_steps(step, args) -> dict:
    """Wall and CPU seconds of each of --repeats steps; peak GPU memory (GiB) on CUDA."""
    wall, cpu = [], []
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for _ in range(args.repeats):
        sync(args.device)
        t0, c0 = time.perf_counter(), time.process_time()
        step()
        sync(args.device)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    peak = torch.cuda.max_memory_allocated() / 2**30 if args.device == "cuda" else None
    return {"wall": wall, "cpu": cpu, "peak": peak}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--layers", type=int, help="default: 2 on cpu, 12 on cuda")
    parser.add_argument("--batch", type=int, help="default: 4 on cpu, 8 on cuda")
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--padded", type=float, default=0.0,
                        help="fraction of each sequence's tail that is padding in half the batch")
    parser.add_argument("--schemes", nargs="*", default=["unas", "dnas", "hnas", "hf"])
    parser.add_argument("--dropouts", nargs="*", type=float, default=[0.1, 0.0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out-dir", default=str(ROOT / "bench" / "results"))
    args = parser.parse_args()
    cuda = args.device == "cuda"
    args.layers = args.layers or (12 if cuda else 2)
    args.batch = args.batch or (8 if cuda else 4)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    ids = torch.randint(1, VOCAB, (args.batch, args.seq), device=args.device)
    padding = torch.zeros(args.batch, args.seq, dtype=torch.bool, device=args.device)
    n_pad = int(args.padded * args.seq)
    if n_pad:
        padding[args.batch // 2:, args.seq - n_pad:] = True
    ids = ids.masked_fill(padding, 0)

    configs = {}  # (kind, dropout) -> step closure
    for p in args.dropouts:
        for kind in args.schemes:
            model = build(kind, args, p).to(args.device).train()
            step = make_step(kind, model, ids, padding, args)
            for _ in range(args.warmup):
                step()
            configs[(kind, p)] = step
    runs: dict = {key: [] for key in configs}
    for r in range(args.rounds):
        for key, step in configs.items():
            runs[key].append(time_steps(step, args))
            print(f"round {r}: {key} {statistics.median(runs[key][-1]['wall']):.3f} s",
                  file=sys.stderr, flush=True)

    results = {}
    for key, rs in runs.items():
        results[key] = {
            "wall": statistics.median(x for r in rs for x in r["wall"]),
            "cpu": statistics.median(x for r in rs for x in r["cpu"]),
            "peak": max(r["peak"] for r in rs) if cuda else None,
        }
    label = {"hf": "HF BertModel (sdpa)", "unas": "ours UNAS", "dnas": "ours DNAS",
             "hnas": "ours HNAS"}
    extra = "peak GPU memory" if cuda else "CPU time"
    rows = []
    for (kind, p), res in results.items():
        unas, hf = results.get(("unas", p)), results.get(("hf", p))

        def ratio(base, key="wall", res=res):
            return f"{res[key] / base[key]:.2f}x" if base else "-"

        third = (f"{res['peak']:.2f} GiB ({ratio(unas, 'peak')} UNAS)" if cuda
                 else f"{res['cpu']:.2f} s ({ratio(unas, 'cpu')} UNAS, {ratio(hf, 'cpu')} HF)")
        rows.append(f"| {p} | {label.get(kind, kind)} | {res['wall']:.3f} s | {ratio(unas)} | "
                    f"{ratio(hf)} | {third} |")
    device = torch.cuda.get_device_name() if cuda else f"CPU, {args.threads} threads"
    header = (
        f"Train step (forward + backward), {device}{', bf16 autocast' if cuda else ', float32'}: "
        f"{args.layers} layers, width {args.width}, {args.heads} heads, B={args.batch}, "
        f"S={args.seq}, padded tail {args.padded:.0%} in half the batch; median of "
        f"{args.rounds} interleaved rounds x {args.repeats} steps; ratios to our UNAS and to HF "
        f"with the same attention dropout, from this run\n\n"
        f"| attn dropout | model | wall time | vs ours UNAS | vs HF | {extra} |\n"
        "|---|---|---|---|---|---|"
    )
    from attention import write_table  # (bench/ is on the path: this script's folder)

    write_table(header + "\n" + "\n".join(rows) + "\n", args, "train_step")


if __name__ == "__main__":
    main()

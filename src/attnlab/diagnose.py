"""Attention sinks and activation outliers of a model that exists already.

    python -m attnlab.diagnose outputs/lm/softpick/<run>/checkpoints/last.ckpt   # an attnlab run
    python -m attnlab.diagnose <a local transformers model directory>            # e.g. MiniLM's
    python -m attnlab.diagnose <path> --key last --eps 0.3 0.2 --batches 8 --out <dir>

Per layer: the sink rate (Gu et al.), exactly-zero attention weights, hidden-state kurtosis
(Bondarenko et al.), largest and median |activation| (Sun et al.); definitions in
`attnlab.diagnostics`. Prints the table and writes `diagnostics.json` and `diagnostics.png` into
its own run dir (`outputs/diagnose/<time>`, or --out), saying where.

- A checkpoint: its run's task and model are rebuilt as `eval.py` does, and the numbers come
  from the first --batches batches of the task's test split (`OutlierDiagnostics`, the callback
  `train.py` runs at the end of test).
- A `transformers` model directory (config.json and weights; loaded offline, eager attention):
  --texts (a JSON-lines file with a "text" field, or plain text: one paragraph per blank-line
  block) or, by default, the 64 Debian package descriptions packaged with attnlab
  (`attnlab/texts/probe_text.jsonl`, from the test split of the corpus `make data` builds), cut to
  --length tokens (Gu et al.: 64). A model is causal when its config says is_decoder or names a
  *ForCausalLM / *LMHeadModel architecture; --key last is BERT's [SEP] (the last real token).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

from attnlab.errors import ConfigError, command

PACKAGED_TEXTS = Path(__file__).parent / "texts" / "probe_text.jsonl"


def parse_key(value: str):
    if value in ("first", "last"):
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: use first, last or a key index") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m attnlab.diagnose", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("path", type=Path, help="an attnlab checkpoint (.ckpt) or a transformers model dir")
    p.add_argument("--key", type=parse_key, default="first",
                   help="the sink key: first (default), last (BERT's [SEP]) or an index")
    p.add_argument("--eps", type=float, nargs="+", default=[0.3, 0.2],
                   help="sink thresholds; the first is `sink_rate` (default: 0.3 0.2)")
    p.add_argument("--batches", type=int, default=8, help="batches measured (default 8)")
    p.add_argument("--batch-size", type=int, default=16, help="texts per batch (model dirs; default 16)")
    p.add_argument("--length", type=int, default=64, help="tokens per text (model dirs; default 64)")
    p.add_argument("--texts", type=Path, help="texts for a model dir (default: the packaged sample)")
    p.add_argument("--out", type=Path, help="the run dir (default: outputs/diagnose/<time>)")
    return p


def default_out() -> Path:
    root = Path(os.environ.get("ATTNLAB_OUTPUTS", Path(os.environ.get("ATTNLAB_ROOT", ".")) / "outputs"))
    return root / "diagnose" / datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S_%f")


def read_texts(path: Path | None) -> list[str]:
    path = PACKAGED_TEXTS if path is None else path
    if not path.is_file():
        raise ConfigError(f"--texts {path}: no such file; give a JSON-lines file with a \"text\" "
                          f"field or a plain-text file")
    raw = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        texts = [json.loads(line)["text"] for line in raw.splitlines() if line.strip()]
    else:
        texts = [" ".join(block.split()) for block in raw.split("\n\n") if block.strip()]
    if not texts:
        raise ConfigError(f"--texts {path} holds no text; give it paragraphs separated by blank lines")
    return texts


# ----------------------------------------------------------------------------- a checkpoint
def diagnose_checkpoint(args, out: Path) -> dict:
    from hydra import compose, initialize_config_dir

    from attnlab import checkpoints, console
    from attnlab.callbacks import OutlierDiagnostics
    from attnlab.cards import CONF_DIR
    from attnlab.evaluation import load_checkpoint_module
    from attnlab.trainer import build_trainer

    overrides = [f"ckpt_path={args.path}", "logger=none", f"paths.output_dir={out}",
                 *checkpoints.task_argument([f"ckpt_path={args.path}"])]
    console.quiet()  # the known-harmless third-party messages (attnlab.console)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("eval", overrides=overrides)
    module, datamodule, _ = load_checkpoint_module(cfg)
    callback = OutlierDiagnostics(max_batches=args.batches, key=args.key, epsilons=args.eps)
    trainer = build_trainer(cfg, logger=False, callbacks=[callback], limit_test_batches=args.batches,
                            default_root_dir=str(out), enable_progress_bar=False,
                            enable_model_summary=False)
    trainer.test(module, datamodule=datamodule, verbose=False)
    return callback.results


# ----------------------------------------------------------------------------- a transformers model
def is_causal(config) -> bool:
    names = getattr(config, "architectures", None) or []
    return bool(getattr(config, "is_decoder", False)) or any(
        n.endswith(("ForCausalLM", "LMHeadModel")) for n in names)


def diagnose_hf(args, out: Path) -> dict:
    import torch

    try:
        from transformers import AutoModel, AutoTokenizer
    except ImportError as err:
        raise ConfigError("a model directory needs `transformers`: pip install transformers") from err
    from attnlab.callbacks.diagnostics import write_png
    from attnlab.diagnostics import LayerOutliers, summarize
    from attnlab.files import atomic_write_text

    texts = read_texts(args.texts)[: args.batches * args.batch_size]
    tokenizer = AutoTokenizer.from_pretrained(args.path, local_files_only=True)
    model = AutoModel.from_pretrained(args.path, local_files_only=True, attn_implementation="eager").eval()
    causal = is_causal(model.config)
    metrics: dict[int, LayerOutliers] = {}
    for start in range(0, len(texts), args.batch_size):
        batch = tokenizer(texts[start:start + args.batch_size], truncation=True, max_length=args.length,
                          padding=True, return_tensors="pt")
        with torch.no_grad():
            outputs = model(**batch, output_attentions=True, output_hidden_states=True)
        padding = batch["attention_mask"] == 0
        for l, weights in enumerate(outputs.attentions):
            metric = metrics.setdefault(l, LayerOutliers(args.key, args.eps))
            metric.update(weights.float(), outputs.hidden_states[l + 1].float(), padding, padding, causal)
    layers = {l: m.compute() for l, m in metrics.items()}
    results = {"key": args.key, "epsilons": list(args.eps), "causal": causal, "texts": len(texts),
               "model": summarize(layers),
               "layers": {str(l): {"name": f"layer {l}", **v} for l, v in layers.items()}}
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "diagnostics.json", json.dumps(results, indent=2) + "\n")
    write_png(out / "diagnostics.png", results)
    return results


def flat(results: dict) -> dict[str, float]:
    """The results as `diagnostics/layer{l}/<name>` and `diagnostics/<name>` (the table's input)."""
    values = {f"diagnostics/{k}": v for k, v in results["model"].items()}
    for l, layer in results["layers"].items():
        values.update({f"diagnostics/layer{l}/{k}": v for k, v in layer.items() if k != "name"})
    return values


@command
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.batches < 1 or args.batch_size < 1 or args.length < 2:
        raise ConfigError("--batches and --batch-size must be >= 1 and --length >= 2")
    path = args.path
    if path.is_dir() and (path / "config.json").is_file():
        kind = "transformers model"
    elif path.is_file():
        kind = "checkpoint"
    else:
        raise ConfigError(f"{path}: neither a checkpoint file nor a transformers model directory "
                          f"(one with config.json); give outputs/<task>/<model>/<run>/checkpoints/"
                          f"last.ckpt or a model directory")
    out = args.out or default_out()
    results = (diagnose_hf if kind == "transformers model" else diagnose_checkpoint)(args, out)
    if not results:
        raise ConfigError(f"{path}: no attention layer was recorded; the model has no attnlab "
                          f"attention module")
    from rich.console import Console

    from attnlab.diagnostics import table

    console = Console()
    console.print(table(flat(results), title=f"sinks and outliers of {path} (sink key: {args.key})"))
    print(f"written: {out / 'diagnostics.json'} and {out / 'diagnostics.png'}")  # unwrapped
    return 0


if __name__ == "__main__":
    sys.exit(main())

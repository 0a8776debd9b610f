"""The hops' attention over one test sentence per class (Repulsive attention's Fig. 1 style):
one heatmap per class, a row per hop, a column per token, written as `hop_attention.png`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from torch import Tensor


class HopExamples:
    """Picks, per class, the first test sentence of at most `max_tokens` tokens (else the shortest
    seen) with its hop weights."""

    def __init__(self, num_classes: int, max_tokens: int = 40) -> None:
        self.max_tokens = int(max_tokens)
        self.chosen: dict[int, dict] = {}
        self.num_classes = int(num_classes)

    def add(self, ids: Tensor, lengths: Tensor, labels: Tensor, predictions: Tensor, weights: Tensor) -> None:
        """weights (B, H, r, n) of the batch's sentences (heads stacked as rows of hops)."""
        for i in range(ids.shape[0]):
            label, n = int(labels[i]), int(lengths[i])
            old = self.chosen.get(label)
            if old is not None and (old["length"] <= self.max_tokens or old["length"] <= n):
                continue
            self.chosen[label] = {"ids": ids[i, :n].tolist(), "length": n, "prediction": int(predictions[i]),
                                  "weights": weights[i, :, :, :n].flatten(0, 1).float().cpu()}

    def write_png(self, path: Path, label_names: Sequence[str], token: Callable[[int], str]) -> Path | None:
        if not self.chosen:
            return None
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        classes = sorted(self.chosen)
        cols = 2 if len(classes) > 1 else 1
        rows = (len(classes) + cols - 1) // cols
        hops = max(c["weights"].shape[0] for c in self.chosen.values())
        width = min(max(c["length"] for c in self.chosen.values()), self.max_tokens)
        fig, axes = plt.subplots(rows, cols, figsize=(cols * (1.0 + 0.17 * width), rows * (1.2 + 0.16 * hops)),
                                 squeeze=False, constrained_layout=True)
        for ax in axes.flat[len(classes):]:
            ax.axis("off")
        for ax, label in zip(axes.flat, classes):
            c = self.chosen[label]
            shown = c["weights"][:, : self.max_tokens]
            ax.imshow(shown.numpy(), aspect="auto", cmap="Reds", vmin=0.0, vmax=float(shown.max().clamp(min=1e-6)))
            ax.set_xticks(range(shown.shape[1]), [token(t) for t in c["ids"][: self.max_tokens]], rotation=90,
                          fontsize=6)
            ax.set_yticks(range(shown.shape[0]), [str(h) for h in range(shown.shape[0])], fontsize=5)
            ax.set_ylabel("hop", fontsize=7)
            name = label_names[label] if label < len(label_names) else str(label)
            guess = label_names[c["prediction"]] if c["prediction"] < len(label_names) else str(c["prediction"])
            cut = f", first {self.max_tokens} of {c['length']} tokens" if c["length"] > self.max_tokens else ""
            ax.set_title(f"{name} (predicted {guess}{cut})", fontsize=8)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=90)
        plt.close(fig)
        return path


def token_names(tokenizer) -> Callable[[int], str]:
    if tokenizer is None:
        return str
    return lambda i: tokenizer.id_to_token(int(i)) or str(i)


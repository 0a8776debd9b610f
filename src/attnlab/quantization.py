"""Low-bit robustness: round-to-nearest fake quantization of a trained network (`eval.py quant=`).

Bondarenko et al.'s setup (NeurIPS 2023, "Quantizable Transformers"; their
Qualcomm-AI-research/outlier-free-transformers `quantization/quantizers/uniform_quantizers.py`):

- weights: symmetric uniform, per tensor (per output channel with `per_channel`): the integer
  grid [-2^(b-1), 2^(b-1) - 1], scale = max|w| / (2^(b-1) - 1), zero point 0;
- activations: asymmetric uniform with a static range, the grid [0, 2^b - 1],
  scale = (max - min) / (2^b - 1) over a range that holds 0 (min <= 0 <= max), zero point
  round(-min / scale); the range is the min and max each activation took on a seeded sample of
  training batches (calibration), then fixed;
- what is quantized: every `nn.Linear` of the network's transformer layers and attention modules
  (projections, feed-forward), its weight and its input; embeddings, norms and the task's head stay
  in full precision (Bondarenko quantize the encoder and skip the head too).

Schemes: `w8a8`, `w4a8` and `w4a16` (16: activations in full precision). The rounding is
PyTorch's own fake-quantization kernels (`torch.fake_quantize_per_tensor_affine`,
`..._per_channel_affine`: round half to even, clamp, rescale), on the CPU and CUDA alike. torchao
was not taken: its CPU path serves real int8 kernels and quantization-aware training, and its
fake-quantization API has changed between minor versions; the two ATen ops are exactly the
simulation this needs and ship with torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnlab.errors import ConfigError


@dataclass(frozen=True)
class Scheme:
    name: str
    weight_bits: int
    activation_bits: int | None  # None: activations stay in full precision


SCHEMES = {s.name: s for s in (Scheme("w8a8", 8, 8), Scheme("w4a8", 4, 8), Scheme("w4a16", 4, None))}


def scheme(name) -> Scheme | None:
    """The scheme `quant=<name>` names; None for `none` (full precision, today's eval)."""
    if name is None or str(name).lower() in ("none", "null", "false"):
        return None
    if str(name) not in SCHEMES:
        raise ConfigError(f"quant={name}: unknown; choose one of none, {', '.join(SCHEMES)}")
    return SCHEMES[str(name)]


# ----------------------------------------------------------------------------- the grids
def symmetric_scale(w: Tensor, bits: int, per_channel: bool = False) -> Tensor:
    """Scale of the signed symmetric grid: max|w| / (2^(b-1) - 1), per tensor or per row."""
    absmax = w.detach().abs().amax(dim=tuple(range(1, w.dim()))) if per_channel else w.detach().abs().max()
    return absmax.clamp(min=1e-8) / (2 ** (bits - 1) - 1)


def fake_quantize_weight(w: Tensor, bits: int, per_channel: bool = False) -> Tensor:
    """w rounded to the nearest point of its symmetric b-bit grid, back in floats."""
    scale = symmetric_scale(w, bits, per_channel).float()
    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    if per_channel:
        zero = torch.zeros(w.shape[0], dtype=torch.int32, device=w.device)
        return torch.fake_quantize_per_channel_affine(w.float(), scale, zero, 0, low, high).to(w.dtype)
    return torch.fake_quantize_per_tensor_affine(w.float(), scale, torch.zeros((), dtype=torch.int32),
                                                 low, high).to(w.dtype)


def asymmetric_qparams(low: float, high: float, bits: int) -> tuple[float, int]:
    """(scale, zero point) of the unsigned b-bit grid over [min(low, 0), max(high, 1e-8)]."""
    low, high = min(float(low), 0.0), max(float(high), 1e-8)
    scale = (high - low) / (2**bits - 1)
    zero = int(min(max(round(-low / scale), 0), 2**bits - 1))
    return scale, zero


def fake_quantize_activation(x: Tensor, low: float, high: float, bits: int) -> Tensor:
    scale, zero = asymmetric_qparams(low, high, bits)
    return torch.fake_quantize_per_tensor_affine(x.float(), scale, zero, 0, 2**bits - 1).to(x.dtype)


# ----------------------------------------------------------------------------- the layers
class FakeQuantLinear(nn.Linear):
    """An nn.Linear whose weight is fake-quantized once and whose input is fake-quantized with a
    static range: `observing` (calibration) records the range, then each forward rounds to it."""

    def __init__(self, linear: nn.Linear, scheme: Scheme, per_channel: bool = False) -> None:
        super().__init__(linear.in_features, linear.out_features, bias=linear.bias is not None,
                         device=linear.weight.device, dtype=linear.weight.dtype)
        with torch.no_grad():
            self.weight.copy_(fake_quantize_weight(linear.weight, scheme.weight_bits, per_channel))
            if linear.bias is not None:
                self.bias.copy_(linear.bias)
        self.activation_bits = scheme.activation_bits
        self.observing = scheme.activation_bits is not None
        self.low, self.high = float("inf"), float("-inf")

    def forward(self, x: Tensor) -> Tensor:
        if self.activation_bits is not None:
            if self.observing:
                self.low = min(self.low, float(x.detach().min()))
                self.high = max(self.high, float(x.detach().max()))
            elif self.low <= self.high:
                x = fake_quantize_activation(x, self.low, self.high, self.activation_bits)
        return super().forward(x)


def quantizable_linears(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    """[(name, module)] of every nn.Linear inside an attention module or transformer layer."""
    from attnlab.attention import MultiHeadAttention
    from attnlab.attention.layers import TransformerDecoderLayer, TransformerEncoderLayer

    blocks = (MultiHeadAttention, TransformerEncoderLayer, TransformerDecoderLayer)
    inside = [name for name, m in model.named_modules() if isinstance(m, blocks)]
    return [(name, m) for name, m in model.named_modules()
            if type(m) is nn.Linear and any(name.startswith(f"{b}.") for b in inside)]


def quantize(model: nn.Module, scheme: Scheme, per_channel: bool = False) -> list[FakeQuantLinear]:
    """Swap every quantizable linear of `model` for a FakeQuantLinear (in place); returns them,
    observing their input ranges (call `fix_ranges` after the calibration batches)."""
    swapped = []
    for name, linear in quantizable_linears(model):
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        layer = FakeQuantLinear(linear, scheme, per_channel)
        setattr(parent, attr, layer)
        swapped.append(layer)
    if not swapped:
        raise ConfigError("quant=: this network has no linear layer inside an attention module or "
                          "transformer layer to quantize")
    return swapped


def fix_ranges(layers: list[FakeQuantLinear]) -> None:
    """End of calibration: every layer rounds its input to the range it saw."""
    for layer in layers:
        layer.observing = False

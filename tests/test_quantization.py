"""Round-to-nearest fake quantization (attnlab.quantization) against a NumPy statement of
Bondarenko et al.'s quantizers (outlier-free-transformers uniform_quantizers.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from attnlab.attention.layers import TransformerEncoderLayer
from attnlab.errors import ConfigError
from attnlab.quantization import (
    SCHEMES,
    FakeQuantLinear,
    asymmetric_qparams,
    fake_quantize_activation,
    fake_quantize_weight,
    fix_ranges,
    quantizable_linears,
    quantize,
    scheme,
    symmetric_scale,
)


def numpy_symmetric(w: np.ndarray, bits: int, per_channel: bool) -> np.ndarray:
    """SymmetricUniformQuantizer (signed): delta = absmax / (2^(b-1) - 1), round, clamp."""
    absmax = np.abs(w).max(axis=1, keepdims=True) if per_channel else np.abs(w).max()
    delta = absmax / (2.0 ** (bits - 1) - 1)
    return np.clip(np.round(w / delta), -(2.0 ** (bits - 1)), 2.0 ** (bits - 1) - 1) * delta


def numpy_asymmetric(x: np.ndarray, low: float, high: float, bits: int) -> np.ndarray:
    """AsymmetricUniformQuantizer: the range holds 0, delta = (max - min) / (2^b - 1),
    zero = round(-min / delta), x_int = clamp(round(x / delta) + zero, 0, 2^b - 1)."""
    low, high = min(low, 0.0), max(high, 1e-8)
    delta = (high - low) / (2.0**bits - 1)
    zero = np.clip(np.round(-low / delta), 0, 2.0**bits - 1)
    return (np.clip(np.round(x / delta) + zero, 0, 2.0**bits - 1) - zero) * delta


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("per_channel", [False, True])
def test_weights_round_to_the_nearest_point_of_the_symmetric_grid(bits, per_channel):
    g = torch.Generator().manual_seed(bits)
    w = torch.randn(6, 10, generator=g) * torch.linspace(0.1, 3.0, 6)[:, None]
    got = fake_quantize_weight(w, bits, per_channel)
    expected = numpy_symmetric(w.double().numpy(), bits, per_channel)
    np.testing.assert_allclose(got.double().numpy(), expected, rtol=0, atol=1e-6)
    scale = symmetric_scale(w, bits, per_channel)
    bound = (scale[:, None] if per_channel else scale) / 2
    assert ((got - w).abs() <= bound * (1 + 1e-5)).all()  # the round-to-nearest error <= scale/2
    levels = torch.unique(got[0] / (scale[0] if per_channel else scale)).round()
    assert levels.numel() <= 2**bits and levels.abs().max() <= 2 ** (bits - 1) - 1


@pytest.mark.parametrize("bits", [8, 4])
def test_activations_round_within_their_static_range_and_clamp_outside(bits):
    g = torch.Generator().manual_seed(10 + bits)
    x = torch.rand(200, generator=g) * 5 - 1  # calibrated on [-1, 4]
    low, high = float(x.min()), float(x.max())
    got = fake_quantize_activation(x, low, high, bits)
    np.testing.assert_allclose(got.double().numpy(), numpy_asymmetric(x.double().numpy(), low, high, bits),
                               rtol=0, atol=1e-6)
    scale, zero = asymmetric_qparams(low, high, bits)
    assert ((got - x).abs() <= scale / 2 * (1 + 1e-5)).all()
    positive = torch.rand(50, generator=g) * 2 + 1  # calibrated on [1, 3]: the grid still holds 0
    np.testing.assert_allclose(fake_quantize_activation(positive, 1.0, 3.0, bits).double().numpy(),
                               numpy_asymmetric(positive.double().numpy(), 1.0, 3.0, bits), rtol=0, atol=1e-6)
    outside = torch.tensor([-50.0, 0.0, 60.0])
    clamped = fake_quantize_activation(outside, low, high, bits)
    assert clamped[1] == 0.0  # zero is a grid point (the asymmetric range holds 0)
    assert clamped[0] == pytest.approx(-zero * scale) and clamped[2] == pytest.approx((2**bits - 1 - zero) * scale)


def test_an_unknown_scheme_is_refused_naming_the_valid_ones():
    assert scheme("none") is None and scheme(None) is None
    assert scheme("w4a16").activation_bits is None and scheme("w8a8").weight_bits == 8
    with pytest.raises(ConfigError, match=r"quant=w3a3x: unknown; choose one of none, w8a8, w4a8, w4a16"):
        scheme("w3a3x")


def test_quantize_swaps_the_transformer_linears_calibrates_then_rounds_its_inputs():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 8), TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0),
                        nn.Linear(8, 3)).eval()
    names = [n for n, _ in quantizable_linears(net)]
    assert names == ["1.self_attn.q_proj", "1.self_attn.k_proj", "1.self_attn.v_proj",
                     "1.self_attn.out_proj", "1.linear1", "1.linear2"]  # not the embedding, not the head
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        full = net(x)
        layers = quantize(net, SCHEMES["w8a8"])
        assert all(isinstance(net.get_submodule(n), FakeQuantLinear) for n in names)
        assert type(net[0]) is nn.Linear and type(net[2]) is nn.Linear
        net(x)  # calibration: the ranges
        first = net.get_submodule("1.linear1")
        assert first.observing and first.low < 0 < first.high
        fix_ranges(layers)
        quantized = net(x)
    assert not torch.equal(quantized, full) and torch.allclose(quantized, full, atol=0.1)
    # after calibration a layer rounds its input to the range it saw (w4a16: never)
    h = torch.randn(3, 8) * 2
    with torch.no_grad():
        expected = nn.functional.linear(fake_quantize_activation(h, first.low, first.high, 8), first.weight,
                                        first.bias)
        torch.testing.assert_close(first(h), expected, rtol=0, atol=0)
        w4a16 = FakeQuantLinear(nn.Linear(8, 4), SCHEMES["w4a16"])
        assert not w4a16.observing
        torch.testing.assert_close(w4a16(h), nn.functional.linear(h, w4a16.weight, w4a16.bias), rtol=0, atol=0)

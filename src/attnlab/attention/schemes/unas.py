"""UNAS: standard attention, softmax over keys (upper-normalized). Vaswani et al. 2017.

Its kernels, best first (SSMax runs on the same ones, on scaled queries: ssmax.py):
- `fused_cpu` for padded calls that are not causal: the fused C++ kernel takes key and query
  padding at no cost, where ATen's flash kernel pays for an additive mask (measured faster:
  docs/results.md, Benchmarks);
- `sdpa`: torch's scaled_dot_product_attention (ATen's flash kernel on the CPU, without dropout,
  for one head size of q, k and v, and unless the scores may overflow it; flash /
  memory-efficient on CUDA);
- `fused_cpu`: attention dropout on the CPU (ATen's flash kernel has none), scores too large
  for it, or a value of another width than the query's, not causal;
- `rowwise_cpu`, causal, where the value is wider (or narrower) than the query, which ATen's CPU
  flash kernel refuses (SDPA would run its materialized math kernel): the row-wise C++ kernel's
  softmax (kernels/rowwise.py), blocks above the diagonal skipped, padding and dropout inside
  (ALiBi's q and k of d + 6; diff's half-width maps over the whole value);
- `sdpa_math`: SDPA's materialized math backend (CPU), e.g. causal with dropout.
"""

from torch import Tensor

from attnlab.attention import notices, paths
from attnlab.attention.kernels import fused, rowwise, sdpa
from attnlab.attention.paths import CPU_DTYPES, AttentionCall, FastPath, compiled_cpu, is_padded
from attnlab.attention.reference import safe_log_normalize
from attnlab.attention.schemes.normalizer import Normalizer
from attnlab.attention.schemes.registry import register


def _sdpa_supports(normalizer, device, dtype, dropout_p, causal) -> bool:
    return sdpa.supports("unas", device, dtype, dropout_p, causal)


def _flash_fits(normalizer, call: AttentionCall) -> bool:
    if paths.device_type(call.q) == "cpu" and value_width_differs(normalizer, call):
        return False  # ATen's CPU flash kernel takes one head size: the row-wise kernel, next
    return sdpa.flash_fits(call.q, call.k, call.dropout_p)  # else the fused kernel, next


def _run_sdpa(normalizer, call: AttentionCall) -> Tensor:
    # (paths.device_type: the device check tests patch to route CPU tensors as CUDA ones)
    notices.key_padding_keeps_flash_off(paths.device_type(call.q), call.q.dtype,
                                        call.key_padding_mask is not None)
    return sdpa.unas_sdpa(call.q, call.k, call.v, *call.masks, call.causal, call.dropout_p)


def fused_cpu_supports(normalizer, device, dtype, dropout_p, causal) -> bool:
    """The fused C++ CPU kernel (DNAS, HNAS, UNAS): not causal, dropout below 1, compiled."""
    return device == "cpu" and dtype in CPU_DTYPES and not causal and dropout_p < 1.0 and fused.load()


def _run_fused(normalizer, call: AttentionCall) -> Tensor:
    return fused.unas_attend(call.q, call.k, call.v, *call.masks, dropout_p=call.dropout_p)


def value_width_differs(normalizer, call: AttentionCall) -> bool:
    return call.v.shape[-1] != call.q.shape[-1]


def _run_rowwise(normalizer, call: AttentionCall) -> Tensor:
    return rowwise.softmax_attend(call.q, call.k, call.v, *call.masks, causal=call.causal,
                                  dropout_p=call.dropout_p)


def _math_supports(normalizer, device, dtype, dropout_p, causal) -> bool:
    return sdpa.supports_math("unas", device, dtype, dropout_p, causal)


def _run_math(normalizer, call: AttentionCall) -> Tensor:
    return sdpa.unas_sdpa_math(call.q, call.k, call.v, *call.masks, call.causal, call.dropout_p)


SDPA = FastPath("sdpa", _sdpa_supports, _run_sdpa, _flash_fits)
FUSED_CPU = FastPath("fused_cpu", fused_cpu_supports, _run_fused, any_value_width=True)
SDPA_MATH = FastPath("sdpa_math", _math_supports, _run_math)
ROWWISE_CPU = FastPath("rowwise_cpu", compiled_cpu, _run_rowwise, value_width_differs,
                       any_value_width=True)
PATHS: tuple[FastPath, ...] = (FUSED_CPU.only(is_padded), SDPA, FUSED_CPU, ROWWISE_CPU, SDPA_MATH)


@register
class UNAS(Normalizer):
    name = "unas"
    fast_paths = PATHS

    def weights(self, logits: Tensor) -> Tensor:
        return safe_log_normalize(logits, dim=-1).exp()

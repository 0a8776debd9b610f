"""Every kernel that the schemes' fast paths run (each scheme's file under attention/schemes/
declares its paths, `attnlab.attention.paths` is the mechanism; docs/attention.md has the table):

- `sdpa.py`: UNAS through `scaled_dot_product_attention` (CUDA flash / memory-efficient; CPU flash
  and math), with key and query padding, causal masks and dropout;
- `fused.py` + `csrc/`: the fused C++ CPU kernel for DNAS / HNAS (and UNAS with dropout or very
  large scores), compiled on first use (`fused.prebuild()` ahead of time, as `make install` does);
- `composed.py`: DNAS / HNAS composed from ATen's CPU flash kernel, where the C++ kernel cannot be
  built;
- `triton_query_normalized.py` (+ `_triton_kernels.py`, `_triton_tiles.py`): DNAS / HNAS on CUDA as Triton kernels
  (triton is imported lazily: CPU-only installs never need it); `triton_ops.py` registers them as
  torch ops so `torch.compile` traces through them; `_triton_configs.py`: their autotune configs
  (compiled for H100 / A100 without a GPU by the build tool `bench/triton_offline.py`: shared
  memory, registers, spills per tile, docs/gpu.md);
- `flex.py`: DNAS / HNAS / Sinkhorn-k on CUDA through PyTorch's FlexAttention (block masks for
  padding, sliding windows, documents; no dropout); `cuda_choices.json`: which of Triton / Flex
  serves each shape, written by `bench/attention.py --device cuda --write-choices`;
- `rowwise.py` (+ `csrc/rowwise.cpp`): sigmoid, sink, softpick on the fused C++ CPU kernel (causal
  calls skip the blocks above the diagonal); `flex_rowwise.py`: them and SSMax on CUDA;
- `stickbreaking.py` (+ `csrc/stickbreaking.cpp`): stick-breaking, flash-style on the CPU;
  `entmax_blocks.py`: entmax by strips of queries (threshold by Newton-bisection per row);
  `selective_blocks.py`: selective attention by blocks of queries; `esp.py`: ESP's transport plans;
- `dropout.py`: the counter-based dropout mask that every kernel (C++, Triton) and the reference
  regenerate from one seed.

Nothing here imports the schemes: kernels take tensors and return tensors.
"""

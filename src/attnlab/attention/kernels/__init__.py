"""Kernels that the schemes' fast paths run (attnlab.attention.paths says which serves what):

- `sdpa.py`: UNAS through `scaled_dot_product_attention` (CUDA flash / memory-efficient; CPU flash
  and math), with key and query padding, causal masks and dropout;
- `triton_query_normalized.py` (+ `_triton_kernels.py`): DNAS / HNAS on CUDA as Triton kernels
  (triton is imported lazily: CPU-only installs never need it);
- `dropout.py`: the counter-based dropout mask that every kernel (C++, Triton) and the reference
  regenerate from one seed.

The fused C++ CPU kernel lives in `../fused.py` + `../csrc/`, the composed fallback in `../composed.py`.
"""

"""treebench's own Triton kernels (imported lazily: backends import them inside
`prepare`, so a machine without Triton can still import every backend).

- `kernels.tree_attention`: tree attention over a paged KV cache, the host-side
  `TreeAttention` launch object;
- `kernels.tree_attention_tl`: its tl forward kernel (every GPU, the CPU interpreter);
- `kernels.tree_attention_ws`: its warp-specialised Gluon forward kernel (sm_90);
- `kernels.tree_attention_reduce`: the split-KV LSE merge kernel;
- `kernels.tree_attention_plan`: tile configs, split-KV heuristic, mask packing
  (no Triton import);
- `kernels.options`: `KernelOptions`, a `TreeAttention`'s launch choices outside
  its plan (no Triton import).
"""

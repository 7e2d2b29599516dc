"""treebench's own Triton kernels (imported lazily: backends import them inside
`prepare`, so a machine without Triton can still import every backend).

- `treebench.kernels.tree_attention`: tree attention over a paged KV cache, the host-side
  `TreeAttention` launch object;
- `treebench.kernels.tree_attention_tl`: its tl forward kernel (every GPU, the CPU interpreter);
- `treebench.kernels.tree_attention_ws`: its warp-specialised Gluon forward kernel (sm_90);
- `treebench.kernels.tree_attention_reduce`: the split-KV LSE merge kernel;
- `treebench.kernels.tree_attention_plan`: tile configs, split-KV heuristic, mask packing
  (no Triton import);
- `treebench.kernels.options`: `KernelOptions`, a `TreeAttention`'s launch choices outside
  its plan (no Triton import).
"""

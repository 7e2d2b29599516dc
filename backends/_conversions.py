"""Pure input conversions shared by the peer adapters (no optional package needed).

Each function turns part of the adapter contract's `BatchInputs` into the form a
peer library takes: FlashInfer's page indptr/indices/last-page lengths and its
flattened boolean mask, xformers' and vLLM's additive tree bias, K/V gathered
through the block table, ragged <-> padded layouts, and the FlexAttention
`mask_mod`. They run on any device, so tests check them on the CPU against
hand-computed cases.

Glossary letters (B, L_b, T_b, S_b, Hq, Hkv, G, D, P, N) are those of
docs/design.md. Index tensors are mappings:
`block_table: [b, logical_page] -> physical_page`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from treebench.harness.model.trees import TokenTree


def token_slots(block_table: torch.Tensor, starts: Sequence[int], lengths: Sequence[int],
                page_size: int) -> torch.Tensor:
    """Flat pool slots of logical positions [start_b, start_b + len_b), request-major.

    Args:
        block_table: (B, max_pages) int32, [b, logical_page] -> physical_page.
        starts: B first logical positions (0 for a whole request, L_b for its tree).
        lengths: B token counts.
        page_size: P.

    Returns:
        (sum len_b,) int64 on block_table's device: [i] -> physical_page * P + offset,
        an index into the pool viewed as (N * P, Hkv, D).
    """
    dev = block_table.device
    lens = torch.tensor(list(lengths), dtype=torch.int64, device=dev)
    b_idx = torch.repeat_interleave(torch.arange(len(lengths), device=dev), lens)   # (n,)
    first = torch.cumsum(lens, 0) - lens                                            # (B,) packed offset
    start = torch.tensor(list(starts), dtype=torch.int64, device=dev)
    pos = torch.arange(int(lens.sum()), device=dev) - first[b_idx] + start[b_idx]  # (n,) logical position
    phys = block_table.long()[b_idx, pos // page_size]                              # (n,) physical page
    return phys * page_size + pos % page_size


def gather_tokens(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Rows of a paged pool at flat `slots`.

    Args:
        cache: (N, P, Hkv, D) paged pool (NHD).
        slots: (n,) int64 from `token_slots`.

    Returns:
        (n, Hkv, D), same dtype and device as `cache` (a copy).
    """
    n, p, h, d = cache.shape
    if cache.element_size() == 1:                     # fp8 codes: gathered as bytes (a plain copy on every device)
        return cache.view(torch.uint8).reshape(n * p, h, d)[slots].view(cache.dtype)
    return cache.reshape(n * p, h, d)[slots]


def is_fp8(t: torch.Tensor) -> bool:
    """True when `t` holds fp8 codes (torch.float8_e4m3fn or torch.float8_e5m2)."""
    return t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


def dequantise(codes: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """K or V values in `dtype` from a pool's stored elements: float32(code) * scale, rounded to
    `dtype` (the query dtype), as vLLM's `_cast_kv_tile` does in-kernel
    (vllm/v1/attention/ops/triton_unified_attention.py). A bf16/fp16 pool (scale 1.0) is returned
    cast to `dtype` (no copy when it already is).

    Args:
        codes: any shape, fp8 codes or values.
        scale: the per-tensor scale of the contract (inputs.k_scale or inputs.v_scale).
        dtype: the result dtype.
    """
    if not is_fp8(codes):
        return codes.to(dtype)
    return (codes.float() * scale).to(dtype)


def gather_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
              seq_lens: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Each request's K/V at logical positions [0, S_b), packed request-major.

    Args:
        k_cache, v_cache: (N, P, Hkv, D) paged pools.
        block_table: (B, max_pages) int32, [b, logical_page] -> physical_page.
        seq_lens: S_b for each request.

    Returns:
        k, v: (sum S_b, Hkv, D) each; never reads a slot past S_b (no NaN tail).
    """
    slots = token_slots(block_table, [0] * len(seq_lens), seq_lens, k_cache.shape[1])
    return gather_tokens(k_cache, slots), gather_tokens(v_cache, slots)


def prefix_sums(lengths: Sequence[int], device: torch.device | str = "cpu") -> torch.Tensor:
    """(B+1,) int32 exclusive prefix sums: [0, n_0, n_0 + n_1, ...]."""
    out = [0]
    for n in lengths:
        out.append(out[-1] + int(n))
    return torch.tensor(out, dtype=torch.int32, device=device)


def pad_ragged(x: torch.Tensor, lengths: Sequence[int], max_len: int, left: bool = False,
               rows: torch.Tensor | None = None) -> torch.Tensor:
    """Packed rows to a zero-padded batch.

    Args:
        x: (sum n_b, ...) packed request-major.
        lengths: n_b per request.
        max_len: padded length, >= max(n_b).
        left: put request b's rows at the end ([max_len - n_b, max_len)) instead
            of the start; bottom-right-aligned causal kernels need this.
        rows: `padded_rows(lengths, max_len, left)` on x's device, computed once
            in setup so that a timed call makes no host-to-device copy (CUDA
            graph capture forbids one); computed here when None.

    Returns:
        (B, max_len, ...) with zeros in the padding.
    """
    out = x.new_zeros((len(lengths), max_len) + tuple(x.shape[1:]))
    rows = padded_rows(lengths, max_len, left, x.device) if rows is None else rows
    out.view(-1, *x.shape[1:])[rows] = x
    return out


def unpad(x: torch.Tensor, lengths: Sequence[int], left: bool = False,
          rows: torch.Tensor | None = None) -> torch.Tensor:
    """Inverse of `pad_ragged`: (B, max_len, ...) -> (sum n_b, ...); `rows` as there."""
    rows = padded_rows(lengths, x.shape[1], left, x.device) if rows is None else rows
    return x.reshape(-1, *x.shape[2:])[rows]


def padded_rows(lengths: Sequence[int], max_len: int, left: bool = False,
                device: torch.device | str = "cpu") -> torch.Tensor:
    """(sum n_b,) int64 on `device`: [i] -> row of packed element i in the (B * max_len) padded view."""
    lens = torch.tensor(list(lengths), dtype=torch.int64, device=device)
    b_idx = torch.repeat_interleave(torch.arange(len(lengths), device=device), lens)
    first = torch.cumsum(lens, 0) - lens
    within = torch.arange(int(lens.sum()), device=device) - first[b_idx]
    shift = (max_len - lens)[b_idx] if left else 0
    return b_idx * max_len + within + shift


def flashinfer_page_metadata(block_table: torch.Tensor, seq_lens: Sequence[int],
                             page_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashInfer's paged-KV description of the batch (its page-table layout).

    Request b owns pages ceil(S_b / P); the last one holds S_b - (pages_b - 1) * P
    tokens, between 1 and P (FlashInfer docs, "KV-cache layout").

    Returns:
        paged_kv_indptr: (B+1,) int32, prefix sums of pages_b.
        paged_kv_indices: (sum pages_b,) int32, [paged_kv_indptr[b] + j] -> physical
            page of request b's logical page j.
        paged_kv_last_page_len: (B,) int32.
        All on block_table's device.
    """
    pages = [-(-int(s) // page_size) for s in seq_lens]                   # ceil(S_b / P)
    indptr = prefix_sums(pages, block_table.device)
    indices = torch.cat([block_table[b, :n] for b, n in enumerate(pages)]).to(torch.int32)
    last = [int(s) - (n - 1) * page_size for s, n in zip(seq_lens, pages)]
    return indptr, indices, torch.tensor(last, dtype=torch.int32, device=block_table.device)


def request_tree_mask(tree: TokenTree, context_len: int) -> torch.Tensor:
    """(T_b, S_b) bool on the CPU: query i sees all of [0, L_b) and its tree ancestors.

    Columns are logical KV positions; [i, L_b + j] is the tree's ancestor mask [i, j].
    """
    ctx = torch.ones(tree.size, context_len, dtype=torch.bool)
    return torch.cat([ctx, tree.ancestor_mask], dim=1)


def flattened_tree_mask(trees: Sequence[TokenTree], context_lens: Sequence[int]) -> torch.Tensor:
    """FlashInfer's `custom_mask`: each request's (T_b, S_b) mask flattened row-major,
    concatenated request by request (FlashInfer docs, "mask layout").

    Returns:
        (sum T_b * S_b,) bool on the CPU; entry qo_off_b + i * S_b + k is
        request b's query i against logical KV position k.
    """
    return torch.cat([request_tree_mask(t, int(l)).flatten() for t, l in zip(trees, context_lens)])


def tree_additive_bias(tree: TokenTree, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(T, T) additive bias: 0 where node j is node i or its ancestor, -inf elsewhere.

    The form xformers' `tree_attention` (`spec_attn_bias`, as its
    `TreeAttnMetadata.attention_bias`) and vLLM's `qq_bias` take.
    """
    return tree.additive_bias(dtype)


def padded_tree_masks(trees: Sequence[TokenTree], max_nodes: int) -> torch.Tensor:
    """(B, max_nodes, max_nodes) bool on the CPU: each ancestor mask in the top-left
    corner, False elsewhere."""
    out = torch.zeros(len(trees), max_nodes, max_nodes, dtype=torch.bool)
    for b, t in enumerate(trees):
        out[b, :t.size, :t.size] = t.ancestor_mask
    return out


def tree_mask_mod(context_lens: torch.Tensor, tree_sizes: torch.Tensor,
                  tree_masks: torch.Tensor) -> Callable:
    """A FlexAttention `mask_mod(b, h, q_idx, kv_idx) -> bool` for padded batches.

    Query row q_idx of request b is tree node q_idx; KV column kv_idx is logical
    position kv_idx. It sees kv_idx when kv_idx < L_b, or when kv_idx - L_b is a
    tree node that is q_idx or an ancestor. Padding rows/columns see nothing.

    Args:
        context_lens: (B,) int L_b.
        tree_sizes: (B,) int T_b.
        tree_masks: (B, T_max, T_max) bool from `padded_tree_masks`.
        All on the device the mask is evaluated on.
    """
    t_max = tree_masks.shape[-1]

    def mask_mod(b, h, q_idx, kv_idx):
        ctx = context_lens[b]
        node = kv_idx - ctx
        in_tree = (node >= 0) & (node < tree_sizes[b]) & (q_idx < tree_sizes[b])
        anc = tree_masks[b, q_idx.clamp(0, t_max - 1), node.clamp(0, t_max - 1)]
        in_ctx = (kv_idx < ctx) & (q_idx < tree_sizes[b])
        return in_ctx | (in_tree & anc)

    return mask_mod


def require_shared_tree(inputs, backend: str, what: str) -> None:
    """Raises ConfigError unless every request carries the same tree (a backend
    whose mask is one (T, T) bias shared by the batch: `what` names that bias)."""
    from treebench.harness.errors import ConfigError

    trees = inputs.trees
    if any(t.parents != trees[0].parents for t in trees):
        raise ConfigError(f"{backend}: tree_per_request='mixed' is not supported; {what} is shared by "
                          "the batch (use tree_per_request='same')")


def prefill_backend(wrapper) -> str:
    """The kernel family a planned FlashInfer prefill wrapper runs: its `_backend` after `plan`
    ("fa2", "fa3", ...; `plan` replaces "auto" by `determine_attention_backend`'s choice,
    flashinfer/prefill.py, 0.6), or "auto" when the wrapper does not say."""
    return str(getattr(wrapper, "_backend", None) or "auto")

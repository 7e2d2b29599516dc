"""Batch inputs over a paged KV cache, built from a case's seed.

The builder makes logical Q/K/V, allocates a pool larger than needed, lays the
pages out as `contiguous`, `shuffled` (one random permutation of the whole pool,
as vLLM's and xformers' own tests do) or `interleaved` (requests' pages
alternate), writes each request's K/V at logical positions [0, S_b) -- the
tree's own K/V at [L_b, S_b) -- and fills every unused slot (free pages and the
tail of each request's last page) with NaN, so a kernel that reads a token it
must not see returns NaN.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from treebench.harness.model.cases import Case
from treebench.harness.model.trees import TokenTree

from treebench.harness.model.tree_specs import parse_tree

TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass
class BatchInputs:
    """One batch, as every backend receives it (the adapter contract's `inputs`).

    Index tensors are mappings: `block_table: [b, logical_page] -> physical_page`;
    entries past a request's last page point at a free (NaN) page.
    """

    q: torch.Tensor             # (sum T_b, Hq, D) dtype: queries, request-major, nodes in tree order
    k_cache: torch.Tensor       # (N, P, Hkv, D) dtype: paged key pool (NHD)
    v_cache: torch.Tensor       # (N, P, Hkv, D) dtype: paged value pool (NHD)
    block_table: torch.Tensor   # (B, max_pages) int32: [b, logical_page] -> physical_page
    context_lens: torch.Tensor  # (B,) int32: L_b
    seq_lens: torch.Tensor      # (B,) int32: S_b = L_b + T_b
    qo_indptr: torch.Tensor     # (B+1,) int32: prefix sums of T_b
    trees: list[TokenTree]      # B token trees
    sm_scale: float             # softmax scale, default 1/sqrt(D)
    case: Case                  # the case these inputs realise
    k_logical: torch.Tensor     # (sum S_b, Hkv, D) dtype: each request's K in logical order (reference only)
    v_logical: torch.Tensor     # (sum S_b, Hkv, D) dtype: each request's V in logical order (reference only)
    kv_indptr: torch.Tensor     # (B+1,) int64 on CPU: prefix sums of S_b into k_logical

    @property
    def dtype(self) -> torch.dtype:
        return self.q.dtype

    @property
    def device(self) -> torch.device:
        return self.q.device

    @property
    def batch_size(self) -> int:
        return len(self.trees)

    @property
    def page_size(self) -> int:
        return self.k_cache.shape[1]

    def host_lists(self) -> tuple[list[int], list[int], list[int]]:
        """(L_b, T_b, S_b) as Python lists (no device sync beyond one copy)."""
        ls = self.context_lens.tolist()
        ts = [t.size for t in self.trees]
        return ls, ts, [l + t for l, t in zip(ls, ts)]

    def causal(self) -> "BatchInputs":
        """The same batch with every tree replaced by a chain of the same T_b:
        plain causal attention over the T_b new tokens (the causal baseline's task)."""
        chains = [parse_tree(f"chain:{t.size - 1}") for t in self.trees]
        return dataclasses.replace(self, trees=chains)


def _page_order(case: Case, pages: list[int], num_pages: int) -> list[list[int]]:
    """Physical page ids for each request's logical pages, by the case's layout."""
    if case.layout == "shuffled":
        g = torch.Generator().manual_seed(case.torch_seed("layout"))
        pool = torch.randperm(num_pages, generator=g).tolist()
        out, start = [], 0
        for n in pages:
            out.append(pool[start:start + n])
            start += n
        return out
    out = [[] for _ in pages]
    nxt = 0
    if case.layout == "contiguous":
        for b, n in enumerate(pages):
            out[b] = list(range(nxt, nxt + n))
            nxt += n
        return out
    for j in range(max(pages)):  # interleaved: page j of every request, then page j+1 ...
        for b, n in enumerate(pages):
            if j < n:
                out[b].append(nxt)
                nxt += 1
    return out


def build_inputs(case: Case, device: str | torch.device = "cpu") -> BatchInputs:
    """Builds the batch for `case` on `device`, deterministically from the case seed.

    Q/K/V are drawn from N(0, 1) in float32 by a generator on `device` (seeded from
    the case, so every GPU draws the same values; the CPU draws other ones) and
    cast to the case dtype; the pool is filled with one vectorised scatter.

    Returns:
        BatchInputs with the pool holding N = used pages + spare free pages, spare
        pages and unused slots filled with NaN.
    """
    dev, dtype = torch.device(device), TORCH_DTYPES[case.dtype]
    trees, lens = case.trees(), case.context_lens()
    seqs = [l + t.size for l, t in zip(lens, trees)]
    P, Hkv, D = case.page_size, case.num_kv_heads, case.head_dim
    pages = [-(-s // P) for s in seqs]                      # ceil(S_b / P)
    num_pages = sum(pages) + max(2, sum(pages) // 4)        # spare NaN pages
    order = _page_order(case, pages, num_pages)
    free_page = min(set(range(num_pages)) - {p for row in order for p in row})  # padding target: a NaN page

    g = torch.Generator(device=dev).manual_seed(case.torch_seed("qkv"))
    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device=dev).to(dtype)
    q = draw(sum(t.size for t in trees), case.num_q_heads, D)                 # (sum T, Hq, D)
    k_log, v_log = draw(sum(seqs), Hkv, D), draw(sum(seqs), Hkv, D)          # (sum S, Hkv, D)

    block_table = torch.full((len(trees), max(pages)), free_page, dtype=torch.int32)
    for b, phys in enumerate(order):
        block_table[b, :len(phys)] = torch.tensor(phys, dtype=torch.int32)
    pos = torch.cat([torch.arange(s) for s in seqs])                         # (sum S,) logical position
    page = torch.cat([torch.tensor(o)[torch.arange(s) // P] for o, s in zip(order, seqs)])  # (sum S,) physical page
    slot = (page.to(dev), (pos % P).to(dev))
    k_cache = torch.full((num_pages, P, Hkv, D), float("nan"), dtype=dtype, device=dev)  # (N, P, Hkv, D)
    v_cache = torch.full_like(k_cache, float("nan"))
    k_cache[slot], v_cache[slot] = k_log, v_log

    qo = torch.tensor([0] + [t.size for t in trees]).cumsum(0).to(torch.int32)
    return BatchInputs(
        q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table.to(dev),
        context_lens=torch.tensor(lens, dtype=torch.int32, device=dev),
        seq_lens=torch.tensor(seqs, dtype=torch.int32, device=dev),
        qo_indptr=qo.to(dev), trees=trees, sm_scale=case.head_dim ** -0.5, case=case,
        k_logical=k_log, v_logical=v_log, kv_indptr=torch.tensor([0] + seqs).cumsum(0))

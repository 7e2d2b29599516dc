"""FlashAttention-4 (`flash_attn.cute`, CuTe DSL) over the paged cache, the tree as a `mask_mod`.

Upstream: `flash_attn.cute.flash_attn_varlen_func` (package flash-attn-4, written against
4.0.0b36 with nvidia-cutlass-dsl and quack-kernels; read in Dao-AILab/flash-attention,
flash_attn/cute/interface.py and mask.py). One call for the batch: queries packed by
`cu_seqlens_q` (qo_indptr), K/V read through `page_table` (the block table; in place, or
from a copy on the TMA path, below), `seqused_k` = S_b, GQA packed (`pack_gqa`),
`return_lse=True`.

The tree is a CuTe `mask_mod(batch, head, m_idx, n_idx, [seqlen_info,] aux_tensors)`,
each index a one-element `cute.TensorSSA` (4.0.0b36's `flash_attn/cute/mask.py` calls it
through `call_mask_mod(mask_mod, b, h, q_idx, kv_idx, seqlen_info, aux_data)`; releases
before `seqlen_info` passed five arguments: `_takes_seqlen_info` reads which), called with
request-local indices: m_idx the node i of request `batch` (PackGQA already unpacked),
n_idx the KV position. It reads three int32 aux tensors built by
`fa4_tree_aux`: the KV column of each position (0 for the context, 1 + j for tree node
j), each node's visibility bits over those columns (bit 0, the context, always set) and
each request's first row. Both tables are padded past the last request so that the
rows and columns of a partial last tile, which the kernel also evaluates, stay in bounds.

Kernel paths: FA4 loads a KV tile by TMA when P equals its KV tile (`fa4_kv_tile`),
else page by page ("paged KV non-TMA", `paged_kv_non_tma` there); the row's `kernel`
says which. The TMA path loads each page whole: the slots of a request's last page past
S_b get a score of -inf (so the LSE is right) but their V still enters P @ V as 0 * V,
which is NaN for the harness's NaN-filled unused slots (seen on the H200 with 4.0.0b36:
every output element non-finite, the LSE exact, P 128 only). On that path the adapter
hands FA4 a copy of the pool whose unused slots of each last page are zero (setup,
untimed; `fa4_finite_tails`), as a serving engine's zero-initialised pool holds; the
page-by-page path zero-fills rows past S_b itself and reads the pool in place.
Its varlen LSE is (Hq, total_q), natural log: transposed to (sum T_b, Hq).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from types import SimpleNamespace

import torch

from treebench.harness.adapter.contract import Backend, Capabilities, register
from treebench.harness.model.cases import Case
from treebench.harness.model.paged import TORCH_DTYPES, BatchInputs

INSTALL_HINT = ("flash_attn.cute (FlashAttention-4) not installed: pip install flash-attn-4 "
                "(pulls nvidia-cutlass-dsl and quack-kernels)")
ARCHES = (9, 10, 11)          # compute capability majors FA4's forward supports (interface.py asserts 9.x-11.x)
ROW_PAD = 384                 # rows past sum T_b: a partial last M tile (128 or 192 rows, x G packed heads)
COL_PAD = 256                 # KV columns past S_max: a partial last N tile (at most 192 wide)


def fa4_kv_tile(head_dim: int, causal: bool, sm_major: int) -> int:
    """FA4's KV tile (n_block_size / tile_n) for this head dim on this GPU generation.

    Source: flash_attn/cute/interface.py (Dao-AILab/flash-attention): SM100/110 use 128;
    SM90's `_tile_size_fwd_sm90` gives 128 for D <= 64, 128 (causal) or 144 for D <= 96,
    128 for D <= 192 and 80 above. P equal to it takes the TMA path.
    """
    if sm_major != 9:
        return 128
    if head_dim <= 64 or 96 < head_dim <= 192:
        return 128
    if head_dim <= 96:
        return 128 if causal else 144
    return 80


def fa4_uses_tma(page_size: int, head_dim: int, causal: bool, sm_major: int) -> bool:
    """Whether FA4 loads K/V pages by TMA: P equal to its KV tile (interface.py passes
    `paged_kv_non_tma=page_size not in [None, tile_n]` to the forward kernel)."""
    return page_size == fa4_kv_tile(head_dim, causal, sm_major)


def fa4_kernel_label(page_size: int, head_dim: int, causal: bool, sm_major: int) -> str:
    """'fa4 tma' when P is FA4's KV tile (its pool copy has zeroed tails), else 'fa4 paged',
    with the arch and the tile."""
    tile = fa4_kv_tile(head_dim, causal, sm_major)
    if fa4_uses_tma(page_size, head_dim, causal, sm_major):
        return f"fa4 tma (sm{sm_major}x, KV tile {tile}, pool copy with zeroed tails)"
    return f"fa4 paged (sm{sm_major}x, KV tile {tile})"


def fa4_finite_tails(inputs: BatchInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Copies of the K and V pools (N, P, Hkv, D), inputs.dtype, with the slots [S_b % P, P)
    of each request's last page set to zero (the pools themselves are left as they are).

    FA4's TMA path multiplies those slots' V by a probability of exactly 0; a zero slot
    keeps that product 0 where the harness's NaN would make it NaN. Slots it never reads
    (free pages, pages past S_b) keep their NaN.
    """
    _, _, ss = inputs.host_lists()
    P = inputs.k_cache.shape[1]
    table = inputs.block_table.cpu()
    k, v = inputs.k_cache.clone(), inputs.v_cache.clone()
    for b, s in enumerate(ss):
        if s % P:
            page = int(table[b, (s - 1) // P])
            k[page, s % P:] = 0
            v[page, s % P:] = 0
    return k, v


def fa4_tree_aux(inputs: BatchInputs) -> list[torch.Tensor]:
    """The mask_mod's aux tensors for `inputs` (pure conversion), int32 on inputs.device.

    Returns:
        [node_col (B, S_max + COL_PAD): [b, n] -> 0 for a context position n < L_b, 1 + j for
        tree node j at n = L_b + j; anc_words (sum T_b + ROW_PAD, W), W = ceil((T_max + 1) / 32):
        bit c % 32 of [qo_indptr[b] + i, c // 32] set iff column c is visible to node i of
        request b (c = 0, the context, always; c = 1 + j for j an ancestor of i or i itself);
        q_start (B,): qo_indptr[:-1]].
    """
    ls, ts, ss = inputs.host_lists()
    B, t_max, s_max = len(ts), max(ts), max(ss)
    node_col = torch.zeros(B, s_max + COL_PAD, dtype=torch.int64)
    for b, (l, t) in enumerate(zip(ls, ts)):
        node_col[b, l:l + t] = torch.arange(1, t + 1)
    words = -(-(t_max + 1) // 32)
    bits = torch.zeros(sum(ts) + ROW_PAD, words * 32, dtype=torch.bool)        # (rows, columns)
    bits[:, 0] = True
    row = 0
    for tree in inputs.trees:
        bits[row:row + tree.size, 1:1 + tree.size] = tree.ancestor_mask
        row += tree.size
    weights = torch.tensor([1 << k for k in range(32)], dtype=torch.int64)
    packed = (bits.view(-1, words, 32).long() * weights).sum(-1)               # (rows, W) in [0, 2^32)
    packed = torch.where(packed >= 1 << 31, packed - (1 << 32), packed)        # as int32 bit patterns
    dev = inputs.device
    return [node_col.to(torch.int32).to(dev), packed.to(torch.int32).to(dev),
            inputs.qo_indptr[:-1].to(torch.int32).contiguous().to(dev)]


def tree_visible(aux: list[torch.Tensor], b: int, m: int, n: int) -> bool:
    """What the CuTe mask_mod computes for request b, node m, KV position n, in Python (tests)."""
    node_col, anc, q_start = aux
    col = int(node_col[b, n])
    word = int(anc[int(q_start[b]) + m, col // 32])
    return bool((word >> (col % 32)) & 1)


@functools.lru_cache(maxsize=2)
def cute_tree_mask_mod(with_seqlen_info: bool) -> Callable:
    """The tree mask as a CuTe `mask_mod` (built once per signature, so FA4's compile cache,
    keyed by the callable's hash, compiles it once). Mirrors `tree_visible`."""
    import cutlass
    from cutlass import cute
    from flash_attn.cute import utils

    if with_seqlen_info:
        @cute.jit
        def tree_mask(batch, head, m_idx, n_idx, seqlen_info, aux_tensors):
            col = aux_tensors[0][batch[0], n_idx[0]]                       # 0: context, 1 + j: node j
            word = aux_tensors[1][aux_tensors[2][batch[0]] + m_idx[0], col // 32]
            return utils.scalar_to_ssa((word >> (col % 32)) & 1, cutlass.Int32) == utils.scalar_to_ssa(
                1, cutlass.Int32)
        return tree_mask

    @cute.jit
    def tree_mask_v1(batch, head, m_idx, n_idx, aux_tensors):
        col = aux_tensors[0][batch[0], n_idx[0]]
        word = aux_tensors[1][aux_tensors[2][batch[0]] + m_idx[0], col // 32]
        return utils.scalar_to_ssa((word >> (col % 32)) & 1, cutlass.Int32) == utils.scalar_to_ssa(1, cutlass.Int32)
    return tree_mask_v1


def _takes_seqlen_info() -> bool:
    """Whether the installed FA4 calls mask_mod with `seqlen_info` (`mask_mod_takes_seqlen_info`
    of its `flash_attn.cute.mask`)."""
    from flash_attn.cute import mask
    return mask_mod_takes_seqlen_info(mask)


def mask_mod_takes_seqlen_info(mask_module) -> bool:
    """Whether FA4's mask module (`flash_attn.cute.mask`) calls a mask_mod with `seqlen_info`.

    4.0.0b36 has `call_mask_mod(mask_mod, batch_idx, head_idx, q_idx, kv_idx, seqlen_info,
    aux_data)`, which passes `(b, h, q_idx, kv_idx, seqlen_info, aux_tensors)`; earlier
    releases called `mask_mod(b, h, q_idx, kv_idx, aux_tensors)` and their mask module never
    names `seqlen_info`. Unreadable source: True (the current signature).
    """
    if hasattr(mask_module, "call_mask_mod"):
        return True
    try:
        return "seqlen_info" in inspect.getsource(mask_module)
    except (OSError, TypeError):
        return True


def _sm_major(device: torch.device) -> int:
    """The compute capability major FA4 picks its tiles for (10, SM100's table, off CUDA)."""
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_capability(device)[0]
    return 10


def pool_bytes(case: Case) -> int:
    """Bytes of the K and V pools of `case`'s batch, with treebench.harness.model.paged's page
    arithmetic: N = sum_b ceil(S_b / P) + max(2, that sum // 4) pages of (P, Hkv, D) each."""
    ts = [t.size for t in case.trees()]
    pages = sum(-(-(ctx + t) // case.page_size) for ctx, t in zip(case.context_lens(), ts, strict=True))
    num_pages = pages + max(2, pages // 4)
    itemsize = TORCH_DTYPES[case.dtype].itemsize
    return 2 * num_pages * case.page_size * case.num_kv_heads * case.head_dim * itemsize


def fa4_lse_rows(lse: torch.Tensor, total_q: int, hq: int) -> torch.Tensor:
    """FA4's varlen LSE, documented (Hq, total_q), as (sum T_b, Hq) (a transposed view)."""
    if tuple(lse.shape) != (hq, total_q):
        raise ValueError(f"FA4 returned lse {tuple(lse.shape)}, expected (Hq, total_q) = ({hq}, {total_q})")
    return lse.transpose(0, 1)


@register
class FA4Tree(Backend):
    """FlashAttention-4 varlen over the paged pool with the tree as a mask_mod.

    Timed: one `flash_attn_varlen_func(q, k_cache, v_cache, cu_seqlens_q=, seqused_k=,
    page_table=, mask_mod=, aux_tensors=, pack_gqa=, return_lse=True)` and the LSE's
    transpose (a view). Setup (untimed): the int32 cu_seqlens_q, seqused_k and page
    table, the mask's aux tensors (`fa4_tree_aux`), on the TMA path (P equal to FA4's KV
    tile) the pool copy with zeroed tails (`fa4_finite_tails`), and one warm-up call that
    compiles (CuTe DSL JIT, cached per shape class). The mask_mod runs on every KV tile,
    context tiles included (no block sparsity is passed).

    bf16/fp16, D 64/96/128 (FA4's SM100 range; SM90 takes more), sm_90 and sm_100/110.
    """

    name = "fa4_tree"
    install_hint = INSTALL_HINT
    capabilities = Capabilities(devices=("cuda",), dtypes=("bfloat16", "float16"), head_dims=(64, 96, 128),
                                page_size_multiple=16, min_compute_capability=(9, 0))
    returns_lse = True
    causal = False

    @staticmethod
    def _api() -> SimpleNamespace:
        """FA4's entry point and the tree mask_mod (imported lazily; tests swap in a fake)."""
        from flash_attn.cute import flash_attn_varlen_func
        return SimpleNamespace(varlen=flash_attn_varlen_func, mask_mod=lambda: cute_tree_mask_mod(_takes_seqlen_info()))

    def load_optional(self) -> object:
        return self._api()

    def availability(self) -> str | None:
        reason = super().availability()
        if reason is None and torch.cuda.get_device_capability()[0] not in ARCHES:
            return f"FA4's forward runs on sm_90 and sm_100/110 only; this GPU is {torch.cuda.get_device_capability()}"
        return reason

    def workspace_bytes(self, case: Case) -> int:
        """Bytes of the pool copy the TMA path takes (`fa4_finite_tails`), else 0."""
        if not fa4_uses_tma(case.page_size, case.head_dim, self.causal, _sm_major(torch.device("cuda"))):
            return 0
        return pool_bytes(case)

    def prepare(self, inputs: BatchInputs) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
        """Builds the page metadata and aux tensors, compiles with one call; returns the timed call.

        Raises:
            BackendUnavailable: flash_attn.cute cannot be imported.
        """
        api = self.optional()
        _, ts, ss = inputs.host_lists()
        hq, hkv = inputs.q.shape[1], inputs.k_cache.shape[2]
        kw: dict[str, object] = {
            "cu_seqlens_q": inputs.qo_indptr.to(torch.int32).contiguous(), "max_seqlen_q": max(ts),
            "max_seqlen_k": max(ss), "seqused_k": inputs.seq_lens.to(torch.int32).contiguous(),
            "page_table": inputs.block_table.to(torch.int32).contiguous(), "softmax_scale": inputs.sm_scale,
            "pack_gqa": hq > hkv, "return_lse": True}
        if self.causal:
            kw["causal"] = True
        else:
            kw.update(mask_mod=api.mask_mod(), aux_tensors=fa4_tree_aux(inputs))
        major, head_dim = _sm_major(inputs.device), inputs.q.shape[2]
        q, total = inputs.q, inputs.q.shape[0]
        if fa4_uses_tma(inputs.page_size, head_dim, self.causal, major):
            k, v = fa4_finite_tails(inputs)                                # whole pages: finite tails
        else:
            k, v = inputs.k_cache, inputs.v_cache                          # page by page: in place

        def run() -> tuple[torch.Tensor, torch.Tensor]:
            out, lse = api.varlen(q, k, v, **kw)                          # (sum T, Hq, D), (Hq, sum T) fp32
            return out, fa4_lse_rows(lse, total, hq)

        run.kernel = fa4_kernel_label(inputs.page_size, head_dim, self.causal, major)
        run()                                                             # compile outside the timed region
        return run


@register
class FA4Causal(FA4Tree):
    """FA4 varlen over the paged pool with `causal=True` (bottom-right aligned), no mask_mod:
    a second causal baseline beside causal_baseline, checked against the causal reference."""

    name = "fa4_causal"
    mask_kind = "causal"
    causal = True

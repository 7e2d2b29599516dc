"""Batch inputs over a paged KV cache, built from a case's seed.

The builder makes logical Q/K/V, allocates a pool larger than needed, lays the
pages out as `contiguous`, `shuffled` (one random permutation of the whole pool,
as vLLM's and xformers' own tests do) or `interleaved` (requests' pages
alternate), writes each request's K/V at logical positions [0, S_b) -- the
tree's own K/V at [L_b, S_b) -- and fills every unused slot (free pages and the
tail of each request's last page) with NaN, so a kernel that reads a token it
must not see returns NaN.

An fp8 pool (`case.kv_dtype` float8_e4m3fn or float8_e5m2) holds 8-bit codes: K/V
are drawn as for any case, divided by `case.k_scale` / `case.v_scale`, clamped to
the format's finite maximum (saturating) and cast; a code c stands for
float(c) * scale. `k_logical` / `v_logical` hold the same codes (the reference
dequantises them exactly), and unused slots hold the NaN code FP8_NAN_CODE.

Backends receive `BatchInputs.for_backend()`: a `BackendInputs` view of the
same tensors without the reference-only fields (`k_logical`, `v_logical`,
`kv_indptr`), so a backend reads K/V only through the paged pool, as a kernel
would; reaching for a reference-only field raises AttributeError naming it.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import torch

from treebench.harness.model.cases import Case
from treebench.harness.model.trees import TokenTree

from treebench.harness.model.tree_specs import parse_tree

TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
                "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}
# The byte every unused slot of an fp8 pool holds: a NaN code (e4m3fn: S.1111.111 = 0x7F; e5m2: S.11111.11 = 0x7F),
# so a kernel that reads one returns NaN (OCP 8-bit floating point spec v1.0, table 1; torch's NaN -> fp8 cast).
FP8_NAN_CODE = 0x7F


REFERENCE_ONLY = ("k_logical", "v_logical", "kv_indptr")  # BatchInputs fields a backend never sees


class _Batch:
    """What both views of a batch derive from the contract fields."""

    q: torch.Tensor
    k_cache: torch.Tensor
    context_lens: torch.Tensor
    trees: list[TokenTree]

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

    def causal(self):
        """The same batch with every tree replaced by a chain of the same T_b:
        plain causal attention over the T_b new tokens (the causal baseline's task)."""
        chains = [parse_tree(f"chain:{t.size - 1}") for t in self.trees]
        return dataclasses.replace(self, trees=chains)  # type: ignore[type-var]


@dataclass
class BackendInputs(_Batch):
    """One batch as a backend receives it (the adapter contract's `inputs`): the
    fields of `BatchInputs` less REFERENCE_ONLY, sharing its tensors.

    Raises:
        AttributeError: on reading a reference-only field (`k_logical`, `v_logical`,
            `kv_indptr`); the message names it and says to read the paged pool.
    """

    q: torch.Tensor             # (sum T_b, Hq, D) dtype: queries, request-major, nodes in tree order
    k_cache: torch.Tensor       # (N, P, Hkv, D) kv dtype (case.kv_dtype_name): paged key pool (NHD); fp8: codes
    v_cache: torch.Tensor       # (N, P, Hkv, D) kv dtype: paged value pool (NHD); fp8: codes
    block_table: torch.Tensor   # (B, max_pages) int32: [b, logical_page] -> physical_page
    context_lens: torch.Tensor  # (B,) int32: L_b
    seq_lens: torch.Tensor      # (B,) int32: S_b = L_b + T_b
    qo_indptr: torch.Tensor     # (B+1,) int32: prefix sums of T_b
    trees: list[TokenTree]      # B token trees
    sm_scale: float             # softmax scale: scores q.k * sm_scale (case.softmax_scale; default 1/sqrt(D))
    case: Case                  # the case these inputs realise
    k_scale: float = 1.0        # per-tensor K scale: a stored code c means c * k_scale (fp8 pools; 1.0 otherwise)
    v_scale: float = 1.0        # per-tensor V scale, likewise

    def __getattr__(self, name: str):
        if name in REFERENCE_ONLY:
            raise AttributeError(f"inputs.{name} is reference-only: a backend reads K/V from the paged pool "
                                 "(k_cache / v_cache through block_table)")
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")


@dataclass
class BatchInputs(BackendInputs):
    """One batch with the reference's unpaged K/V; backends get `for_backend()`.

    Index tensors are mappings: `block_table: [b, logical_page] -> physical_page`;
    entries past a request's last page point at a free (NaN) page.
    """

    # q ... case: the contract's fields, from BackendInputs; then the reference's:
    k_logical: torch.Tensor = dataclasses.field(kw_only=True)  # (sum S_b, Hkv, D) kv dtype: each request's K in logical order (reference only)
    v_logical: torch.Tensor = dataclasses.field(kw_only=True)  # (sum S_b, Hkv, D) kv dtype: each request's V in logical order (reference only)
    kv_indptr: torch.Tensor = dataclasses.field(kw_only=True)  # (B+1,) int64 on CPU: prefix sums of S_b into k_logical

    def logical_from_pool(self) -> None:
        """Rewrites `k_logical` / `v_logical` ((sum S_b, Hkv, D), the kv dtype) in place from
        `k_cache` / `v_cache` ((N, P, Hkv, D)), read through block_table, bit for bit as bytes
        (fp8 codes included), after a caller changed pool slots (e.g. a test that writes chosen
        codes): the reference reads the logical copies. Raises nothing."""
        P = self.page_size
        ptr = self.kv_indptr.tolist()
        for b, s in enumerate(self.host_lists()[2]):
            pages = self.block_table[b, :-(-s // P)].long()
            for pool, logical in ((self.k_cache, self.k_logical), (self.v_cache, self.v_logical)):
                rows = pool.view(torch.uint8).index_select(0, pages).flatten(0, 1)[:s]
                logical.view(torch.uint8)[ptr[b]:ptr[b] + s] = rows

    def for_backend(self) -> BackendInputs:
        """The view a backend gets: the same tensors (no copy), reference-only fields absent."""
        kept = {f.name: getattr(self, f.name) for f in dataclasses.fields(BackendInputs)}
        return BackendInputs(**kept)


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


POSITION_BITS = 12   # position bits a "position" V row spells (positions mod 4096)


def position_values(pos: torch.Tensor, num_kv_heads: int, head_dim: int) -> torch.Tensor:
    """V rows that encode their own position and KV head.

    Channel d of the row at logical position s, KV head h is +(1 + h/Hkv) when bit
    (d mod POSITION_BITS) of s is set and -(1 + h/Hkv) otherwise: the sign pattern
    names the position, the magnitude the head, so attending to one wrong token or
    reading the wrong KV head moves whole channels, far past any tolerance.

    Args:
        pos: (sum S_b,) int64 logical positions.

    Returns:
        (sum S_b, Hkv, D) float32 on pos.device.
    """
    bits = torch.arange(head_dim) % POSITION_BITS                            # (D,)
    sign = ((pos[:, None] >> bits[None, :]) & 1) * 2.0 - 1.0                 # (sum S, D)
    mag = 1.0 + torch.arange(num_kv_heads) / num_kv_heads                    # (Hkv,)
    return sign[:, None, :] * mag[None, :, None]                             # (sum S, Hkv, D)


def quantise(x: torch.Tensor, dtype: torch.dtype, scale: float) -> torch.Tensor:
    """fp8 codes of float values: x / scale clamped to the format's finite range, then cast (round to
    nearest even), as vLLM's `reshape_and_cache_flash` stores an fp8 KV cache.

    Args:
        x: any shape, float32.
        dtype: torch.float8_e4m3fn or torch.float8_e5m2.
        scale: the per-tensor scale (> 0); a code c then means float(c) * scale.

    Returns:
        codes of x's shape in `dtype` on x.device.
    """
    top = torch.finfo(dtype).max                                             # 448 (e4m3fn), 57344 (e5m2)
    return (x / scale).clamp(-top, top).to(dtype)


def _pool(num_pages: int, P: int, Hkv: int, D: int, dtype: torch.dtype, dev: torch.device,
          slot: tuple[torch.Tensor, torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
    """(N, P, Hkv, D) pool in `dtype` with `rows` (sum S, Hkv, D) at `slot` and NaN (fp8: the NaN code) elsewhere.

    fp8 pools are filled and scattered through a uint8 view (a plain byte copy on every device)."""
    if dtype.itemsize == 1:
        pool = torch.full((num_pages, P, Hkv, D), FP8_NAN_CODE, dtype=torch.uint8, device=dev)
        pool[slot] = rows.view(torch.uint8)
        return pool.view(dtype)
    pool = torch.full((num_pages, P, Hkv, D), float("nan"), dtype=dtype, device=dev)
    pool[slot] = rows
    return pool


TRUTHY = ("1", "true", "yes", "on", "y")   # the values Triton reads as on, in any case (getenv_bool, Triton 3.9)


def triton_interpret() -> bool:
    """Whether Triton runs its kernels in its CPU interpreter: $TRITON_INTERPRET as Triton reads it
    (`triton.knobs.runtime.interpret`, an env_bool: `TRITON_INTERPRET=true` is on, as is `1`,
    `yes`, `on`, `y`, in any case; unset, empty or any other value is off). Triton is not imported;
    raises nothing."""
    return os.environ.get("TRITON_INTERPRET", "").lower() in TRUTHY


def build_inputs(case: Case, device: str | torch.device = "cpu",
                 trees: list[TokenTree] | None = None) -> BatchInputs:
    """Builds the batch for `case` on `device`, deterministically from the case seed.

    Q/K/V are drawn from N(0, 1) in float32 by a generator on `device` (seeded from
    the case, so every GPU draws the same values; the CPU draws other ones) and
    cast to the case dtype; the pool is filled with one vectorised scatter.
    `case.logit_scale` multiplies Q and K by its square root before the cast (scores
    q.k / sqrt(D) of standard deviation ~logit_scale); `sm_scale` is `case.softmax_scale`
    (case.sm_scale, or 1/sqrt(D) when it is None); `case.values == "position"`
    replaces V by `position_values`, and "mean" does that and zeroes Q and K. An fp8
    `case.kv_dtype` stores `quantise`d codes of the same draws (K / k_scale, V / v_scale)
    and sets `k_scale` / `v_scale`.

    Args:
        trees: B trees to use instead of `case.trees()` (the check's re-prepare batch gives the
            same trees to other requests); None: the case's.

    Returns:
        BatchInputs with the pool holding N = used pages + spare free pages, spare
        pages and unused slots filled with NaN (fp8: FP8_NAN_CODE).

    Raises:
        ValueError: `trees` does not hold B trees.
    """
    dev, dtype, kv_dtype = torch.device(device), TORCH_DTYPES[case.dtype], TORCH_DTYPES[case.kv_dtype_name]
    lens = case.context_lens()
    trees = case.trees() if trees is None else list(trees)
    if len(trees) != case.batch_size:
        raise ValueError(f"build_inputs: {len(trees)} trees for a batch of {case.batch_size}")
    seqs = [l + t.size for l, t in zip(lens, trees)]
    P, Hkv, D = case.page_size, case.num_kv_heads, case.head_dim
    pages = [-(-s // P) for s in seqs]                      # ceil(S_b / P)
    num_pages = sum(pages) + max(2, sum(pages) // 4)        # spare NaN pages
    order = _page_order(case, pages, num_pages)
    free_page = min(set(range(num_pages)) - {p for row in order for p in row})  # padding target: a NaN page

    g = torch.Generator(device=dev).manual_seed(case.torch_seed("qkv"))
    def draw(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device=dev) * scale          # float32
    root = case.logit_scale ** 0.5                                            # 1.0 leaves the draws bit-identical
    q = draw(sum(t.size for t in trees), case.num_q_heads, D, scale=root)      # (sum T, Hq, D)
    k_log, v_log = draw(sum(seqs), Hkv, D, scale=root), draw(sum(seqs), Hkv, D)  # (sum S, Hkv, D)
    pos = torch.cat([torch.arange(s) for s in seqs])                         # (sum S,) logical position
    if case.values in ("position", "mean"):
        v_log = position_values(pos, Hkv, D).to(dev)
    if case.values == "mean":
        q, k_log = torch.zeros_like(q), torch.zeros_like(k_log)
    q = q.to(dtype)
    if case.kv_fp8:
        k_log, v_log = quantise(k_log, kv_dtype, case.k_scale), quantise(v_log, kv_dtype, case.v_scale)
    else:
        k_log, v_log = k_log.to(kv_dtype), v_log.to(kv_dtype)

    block_table = torch.full((len(trees), max(pages)), free_page, dtype=torch.int32)
    for b, phys in enumerate(order):
        block_table[b, :len(phys)] = torch.tensor(phys, dtype=torch.int32)
    page = torch.cat([torch.tensor(o)[torch.arange(s) // P] for o, s in zip(order, seqs)])  # (sum S,) physical page
    slot = (page.to(dev), (pos % P).to(dev))
    k_cache = _pool(num_pages, P, Hkv, D, kv_dtype, dev, slot, k_log)       # (N, P, Hkv, D)
    v_cache = _pool(num_pages, P, Hkv, D, kv_dtype, dev, slot, v_log)

    qo = torch.tensor([0] + [t.size for t in trees]).cumsum(0).to(torch.int32)
    return BatchInputs(
        q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table.to(dev),
        context_lens=torch.tensor(lens, dtype=torch.int32, device=dev),
        seq_lens=torch.tensor(seqs, dtype=torch.int32, device=dev),
        qo_indptr=qo.to(dev), trees=trees, sm_scale=case.softmax_scale, case=case,
        k_scale=case.k_scale, v_scale=case.v_scale,
        k_logical=k_log, v_logical=v_log, kv_indptr=torch.tensor([0] + seqs).cumsum(0))

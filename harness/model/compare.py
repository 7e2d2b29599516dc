"""Compare a backend's output with the reference: a record, not a bool.

Tolerance per dtype, and why (an element passes when
|out - ref| <= atol + rtol * |ref|, as torch.allclose):

- bfloat16: 8 mantissa bits, unit roundoff 2^-8 = 0.0039. Inputs are rounded
  to bf16 before the reference sees them, so the only error left is the
  backend's: P rounded to bf16 for the P@V product (relative 2^-8 per term,
  averaging down over S terms) and the output rounded to bf16 (|o| < ~4 for
  N(0,1) values: half an ulp is at most 2^-7 = 0.0078). atol 1.6e-2 = 2 ulps
  at |o| ~ 2 plus accumulation slack; rtol 1.6e-2 likewise. A mask or paging
  bug moves outputs by O(0.1).
- float16: 11 mantissa bits, roundoff 2^-11 = 4.9e-4; same reasoning, 4x
  finer: atol 4e-3, rtol 4e-3.
- float32: kernels may use TF32 (10-bit mantissa) in tensor-core dot
  products, so the bound is fp16-like, not fp32's 6e-8: atol 2e-3, rtol 2e-3.

KV in another dtype than the queries (`case.kv_dtype`; fp8 pools above all), keyed
by the query dtype (KV_CAST_TOLERANCES, `tolerance`). The reference dequantises
the stored codes exactly (float64(code) * scale), so quantisation costs nothing;
what is left is the kernel's own extra rounding: it may round each dequantised
K/V element to the query dtype before the matmul (vLLM's `_cast_kv_tile`:
`(code.to(f32) * scale).to(Q.dtype)`, triton_unified_attention.py). An e4m3 code
has 4 significant bits and an e5m2 code 3, so with a power-of-two scale the
product is exact in bf16 (8 bits) and fp16 (11 bits) and only the dtype's own
budget above applies; with any other scale each K/V element gains one rounding,
relative u = 2^-9 (bf16) or 2^-12 (fp16). Rounded V moves an output by at most
u * max|v| (|v| < ~4: 0.008 for bf16, 0.001 for fp16); rounded K moves a score by
about u * |q||k| * sm_scale / sqrt(3) for random-signed errors (~u for N(0, 1)
data), which moves the output by about that times |v|, another ~0.004 (bf16).
So: bfloat16 queries atol = rtol = 2.4e-2 (the bf16 1.6e-2 plus 0.008),
float16 6e-3 (4e-3 plus 0.002). A bf16/fp16 pool under float32 queries is exact
in float32: float32's bound. A wrong scale (2x), a swapped pair or a code read
as the other format moves outputs by O(0.1-1), far outside these.

Any NaN or Inf in the output is a mismatch, whatever the tolerance.

LSE (`compare_lse`, for a backend with `returns_lse`): natural log, (sum T_b, Hq)
float32, checked against the float64 reference's with |lse - ref| <= atol + rtol * |ref|.
Its error is the scores' (q and k are exact in a bf16/fp16 product; float32 accumulation
over D terms, relative <= D * 2^-24 ~ 8e-6 of sum |q_d k_d| at D 128), the float32
exp2/log2 (relative 2^-22), and the row sum's: a kernel that sums the probabilities it
has rounded to the input dtype for the P V product (FlashInfer's prefill does: its bf16
LSE was 1.2e-3-1.5e-3 off on rows that see a few keys, on an H200, where its fp16 LSE
and every output passed) carries their relative error, at most the unit roundoff 2^-8
(bf16, 8 significant bits) or 2^-11 (fp16, 11), into the sum, so at most ~3.9e-3 (bf16)
or ~4.9e-4 (fp16) into its log. bf16 gets atol 4e-3, that worst case (2.7x the largest
error seen), fp16 1e-3 (twice it), both rtol 1e-4 (|lse| reaches 1e4 at the check's
large logits: rtol covers the accumulation there).
float32 cases may run TF32 products (inputs rounded to 2^-11): score errors up to
~1e-3 of sum |q_d k_d| * scale, a few 1e-3 for N(0, 1) data: atol 1e-2, rtol 5e-3.
An LSE in log2 (x 1.44), transposed, or another request's is off by O(1) or more.
A row that sees nothing has lse -inf in the reference; -inf there matches, any other
value (FlashAttention-2 writes +inf) is a mismatch, as is NaN anywhere.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

TOLERANCES: dict[str, tuple[float, float]] = {  # dtype -> (atol, rtol); reasons above
    "bfloat16": (1.6e-2, 1.6e-2),
    "float16": (4e-3, 4e-3),
    "float32": (2e-3, 2e-3),
}
KV_CAST_TOLERANCES: dict[str, tuple[float, float]] = {  # query dtype -> (atol, rtol) when kv_dtype differs
    "bfloat16": (2.4e-2, 2.4e-2),
    "float16": (6e-3, 6e-3),
    "float32": TOLERANCES["float32"],
}


def tolerance(dtype: str, kv_dtype: str | None = None) -> tuple[float, float]:
    """(atol, rtol) for queries of `dtype` over a pool of `kv_dtype` (None or equal: the query dtype).

    Raises:
        KeyError: an unknown dtype name.
    """
    if kv_dtype is None or kv_dtype == dtype:
        return TOLERANCES[dtype]
    return KV_CAST_TOLERANCES[dtype]

LSE_TOLERANCES: dict[str, tuple[float, float]] = {  # dtype -> (atol, rtol) of the LSE; reasons above
    "bfloat16": (4e-3, 1e-4),
    "float16": (1e-3, 1e-4),
    "float32": (1e-2, 5e-3),
}


@dataclass(frozen=True)
class CorrectnessRecord:
    """What one (case, backend) comparison found."""

    passed: bool
    max_abs_err: float                       # max |out - ref| over finite elements (inf if any non-finite)
    max_rel_err: float                       # max |out - ref| / max(|ref|, atol)
    mismatch_frac: float                     # fraction of elements outside tolerance (non-finite included)
    atol: float
    rtol: float
    worst: tuple[int, int, int] | None       # (request, node, head) of the worst element
    nonfinite: int                           # NaN/Inf elements in the output

    def as_row(self) -> dict:
        d = asdict(self)
        d["worst"] = list(self.worst) if self.worst else None
        return d


def compare(out: torch.Tensor, ref: torch.Tensor, qo_indptr: torch.Tensor, dtype: str,
            atol: float | None = None, rtol: float | None = None, kv_dtype: str | None = None) -> CorrectnessRecord:
    """Compares out (sum T_b, Hq, D) with ref of the same shape.

    Args:
        out: backend output, any float dtype, any device.
        ref: float64 reference.
        qo_indptr: (B+1,) prefix sums of T_b, to map the worst row to (request, node).
        dtype: case dtype name, selects TOLERANCES unless atol/rtol are given.
        kv_dtype: the case's pool dtype (`Case.kv_dtype`); another than `dtype` selects
            KV_CAST_TOLERANCES (`tolerance`).

    Raises:
        ValueError: shapes differ (the runner records it as an error).
    """
    if tuple(out.shape) != tuple(ref.shape):
        raise ValueError(f"output shape {tuple(out.shape)} != expected {tuple(ref.shape)}")
    a0, r0 = tolerance(dtype, kv_dtype)
    atol = a0 if atol is None else atol
    rtol = r0 if rtol is None else rtol
    o, r = out.detach().to(ref.device, torch.float64), ref
    finite = torch.isfinite(o)
    diff = (o - r).abs().masked_fill(~finite, float("inf"))              # (sum T, Hq, D)
    bad = diff > atol + rtol * r.abs()
    rel = diff / r.abs().clamp_min(atol)
    per_elem = torch.where(finite, rel, torch.full_like(rel, float("inf")))
    flat = int(per_elem.reshape(-1).argmax()) if diff.numel() else 0
    row, head = divmod(flat // out.shape[-1], out.shape[1])
    ptr = qo_indptr.tolist()
    req = max(i for i in range(len(ptr) - 1) if ptr[i] <= row) if diff.numel() else 0
    n_bad = int(bad.sum())
    return CorrectnessRecord(
        passed=n_bad == 0,
        max_abs_err=float(diff.max()) if diff.numel() else 0.0,
        max_rel_err=float(per_elem.max()) if diff.numel() else 0.0,
        mismatch_frac=n_bad / max(diff.numel(), 1),
        atol=atol, rtol=rtol,
        worst=(req, row - ptr[req], head) if diff.numel() else None,
        nonfinite=int((~finite).sum()))


@dataclass(frozen=True)
class LseRecord:
    """What the comparison of a backend's LSE with the reference's found."""

    passed: bool
    max_abs_err: float                       # max |lse - ref| (inf where one is non-finite and they differ)
    atol: float
    rtol: float
    worst: tuple[int, int, int] | None       # (request, node, head) of the worst element
    mismatch_frac: float                     # fraction of (node, head) entries outside tolerance
    nonfinite: int = 0                       # NaN or +inf entries, and -inf where the reference is finite

    def reason(self) -> str:
        """'lse: max |err| X at (request b, node i, head h); F of entries out of tolerance[, N non-finite]'."""
        where = f" at (request {self.worst[0]}, node {self.worst[1]}, head {self.worst[2]})" if self.worst else ""
        nonfinite = f", {self.nonfinite} non-finite" if self.nonfinite else ""
        return (f"lse: max |err| {self.max_abs_err:.3g}{where}; {self.mismatch_frac:.1%} of (node, head) entries "
                f"out of tolerance (atol {self.atol:g}, rtol {self.rtol:g}){nonfinite}")


def compare_lse(lse: torch.Tensor, ref: torch.Tensor, qo_indptr: torch.Tensor, dtype: str) -> LseRecord:
    """Compares a backend's LSE with the reference's (tolerances and reasons in the module docstring).

    Args:
        lse: (sum T_b, Hq) natural-log LSE, any float dtype, any device.
        ref: (sum T_b, Hq) float64 reference LSE (-inf for a row that sees nothing).
        qo_indptr: (B+1,) prefix sums of T_b, to map the worst entry to (request, node).
        dtype: case dtype name, selects LSE_TOLERANCES.

    Raises:
        ValueError: shapes differ.
    """
    if tuple(lse.shape) != tuple(ref.shape):
        raise ValueError(f"lse shape {tuple(lse.shape)} != expected (sum T_b, Hq) = {tuple(ref.shape)}")
    atol, rtol = LSE_TOLERANCES[dtype]
    x = lse.detach().to(ref.device, torch.float64)
    same_inf = (x == ref) & torch.isinf(ref)                               # -inf == -inf: an empty row, right
    diff = torch.where(same_inf, torch.zeros_like(ref), (x - ref).abs())   # (sum T, Hq); NaN where either is NaN
    diff = torch.nan_to_num(diff, nan=float("inf"), posinf=float("inf"))
    bad = diff > atol + rtol * torch.where(torch.isfinite(ref), ref.abs(), torch.zeros_like(ref))
    if not diff.numel():
        return LseRecord(True, 0.0, atol, rtol, None, 0.0)
    flat = int(diff.reshape(-1).argmax())
    row, head = divmod(flat, lse.shape[1])
    ptr = qo_indptr.tolist()
    req = max(i for i in range(len(ptr) - 1) if ptr[i] <= row)
    nonfinite = int((~torch.isfinite(x) & ~same_inf).sum())
    return LseRecord(passed=not bool(bad.any()), max_abs_err=float(diff.max()), atol=atol, rtol=rtol,
                     worst=(req, row - ptr[req], head), mismatch_frac=int(bad.sum()) / diff.numel(),
                     nonfinite=nonfinite)

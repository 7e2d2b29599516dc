"""fa4_tree and fa4_causal on a GPU with FlashAttention-4 installed: each tiny case through
the check's own pair (prepare, call, repeat, LSE, re-prepare on a second batch), printing the
kernel path FA4 took. A row that does not pass is run once more by hand (`diagnose`), and the
failure message gives what the next run needs: the kernel path, the installed FA4 version,
the output's and the LSE's non-finite counts with the first non-finite (request, node, head),
the largest finite error and where, and for a raising call the last frames of its traceback.
Skips without CUDA or without `flash_attn.cute`.

    source .fa4b/env.sh && python -m pytest -q -s tests/test_fa4_gpu.py
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import traceback

import pytest
import torch

from treebench.backends.fa4_tree import FA4Causal, FA4Tree
from treebench.harness.model.cases import Case
from treebench.harness.run.config import RunConfig
from treebench.harness.run.pair import CaseData, run_case_backend

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("flash_attn") is None
                       or importlib.util.find_spec("flash_attn.cute") is None,
                       reason="flash_attn.cute (FlashAttention-4) not importable: source .fa4b/env.sh"),
]

CASES = [
    {"batch_size": 2, "context_len": 40, "tree": "full:2:2", "page_size": 16},
    {"batch_size": 2, "context_len": 200, "tree": "full:2:2", "page_size": 128},
    {"batch_size": 4, "context_len": "ragged:0-300", "tree": "full:3:2", "page_size": 16, "tree_per_request": "mixed"},
    {"batch_size": 3, "context_len": "ragged:1-260", "tree": "random:40:3", "page_size": 128,
     "tree_per_request": "mixed"},
    {"batch_size": 2, "context_len": 129, "tree": "chain:6", "page_size": 16, "num_q_heads": 8, "num_kv_heads": 1},
    {"batch_size": 1, "context_len": 0, "tree": "full:2:1", "page_size": 128},
]


def _fa4_version() -> str:
    for dist in ("flash-attn-4", "flash_attn_4", "flash-attn", "flash_attn"):
        try:
            return f"{dist} {importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return "flash_attn version unknown"


def _where(flat: int, qo_indptr: list[int], per_row: int, hq: int) -> str:
    """'(request b, node i, head h)' of flat element `flat` of a (sum T_b, Hq, per_row) tensor."""
    row, rest = divmod(flat, hq * per_row)
    b = max(i for i in range(len(qo_indptr) - 1) if qo_indptr[i] <= row)
    return f"(request {b}, node {row - qo_indptr[b]}, head {rest // per_row})"


def diagnose(backend, case: Case, device: str = "cuda") -> str:
    """One more prepare and call of `backend` on `case`, outside the check; what went wrong, one
    line per finding (it never raises: a raising call is reported with its traceback's tail)."""
    device = torch.device(device)
    data = CaseData(case)
    inputs, ref = data.get(device, getattr(backend, "mask_kind", "tree"))
    ref_lse = data.lse(device, getattr(backend, "mask_kind", "tree"))
    gpu = (f"{torch.cuda.get_device_name()} sm_{''.join(map(str, torch.cuda.get_device_capability()))}"
           if device.type == "cuda" else str(device))
    lines = [f"{_fa4_version()}; torch {torch.__version__}; {gpu}"]
    try:
        fn = backend.prepare(inputs.for_backend())
        lines.append(f"kernel: {getattr(fn, 'kernel', None)}")
        out, lse = fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 -- the diagnosis reports any failure of the real kernel
        tail = traceback.format_exc().strip().splitlines()[-14:]
        return "\n".join([*lines, "the call raised:", *tail])
    qo = inputs.qo_indptr.tolist()
    hq, d = out.shape[1], out.shape[2]
    lines.append(f"out {tuple(out.shape)} {out.dtype}, lse {tuple(lse.shape)} {lse.dtype} stride {lse.stride()}")
    for name, got, want, per_row in (("out", out, ref, d), ("lse", lse, ref_lse, 1)):
        got = got.double()
        bad = ~got.isfinite()
        if bad.any():
            first = int(bad.flatten().nonzero()[0])
            kinds = f"{int(got.isnan().sum())} NaN, {int(got.isinf().sum())} inf"
            lines.append(f"{name}: {int(bad.sum())} of {got.numel()} non-finite ({kinds}); first at "
                         f"{_where(first, qo, per_row, hq)}")
        err = (got - want.to(got.device)).abs().masked_fill(bad, 0)
        worst = int(err.flatten().argmax())
        lines.append(f"{name}: max finite |err| {float(err.max()):.3g} at {_where(worst, qo, per_row, hq)}")
    return "\n".join(lines)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("kw", CASES, ids=lambda kw: f"B{kw['batch_size']}-P{kw['page_size']}-{kw['tree']}")
@pytest.mark.parametrize("cls", [FA4Tree, FA4Causal], ids=["fa4_tree", "fa4_causal"])
def test_fa4_matches_the_reference(cls, kw, head_dim, dtype):
    axes = {"num_q_heads": 4, "num_kv_heads": 2, "head_dim": head_dim, "dtype": dtype, "layout": "shuffled"}
    case = Case(**{**axes, **kw})
    backend = cls()
    reason = backend.availability() or backend.supports(case)
    if reason:
        pytest.skip(reason)
    config = RunConfig(mode="check", device="cuda", quiet=True)
    row = run_case_backend(backend, case, CaseData(case), None, torch.device("cuda"), config)
    print(f"\n{cls.name} {case.case_id}: {row['status']} kernel={row['kernel']} "
          f"max_abs_err={row['max_abs_err']} lse_max_abs_err={row['lse_max_abs_err']} {row['reason'] or ''}")
    if row["status"] != "pass":
        pytest.fail(f"{row['status']}: {row['reason']}\n{diagnose(cls(), case)}", pytrace=False)
    assert row["kernel"] and row["kernel"].startswith("fa4 ")
    assert row["lse_max_abs_err"] is not None

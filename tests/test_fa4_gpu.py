"""fa4_tree and fa4_causal on a GPU with FlashAttention-4 installed: each tiny case through
the check's own pair (prepare, call, repeat, LSE, re-prepare on a second batch), printing the
kernel path FA4 took. Skips without CUDA or without `flash_attn.cute`.

    source .fa4b/env.sh && python -m pytest -q -s tests/test_fa4_gpu.py
"""

from __future__ import annotations

import importlib.util

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
    dict(batch_size=2, context_len=40, tree="full:2:2", page_size=16),
    dict(batch_size=2, context_len=200, tree="full:2:2", page_size=128),
    dict(batch_size=4, context_len="ragged:0-300", tree="full:3:2", page_size=16, tree_per_request="mixed"),
    dict(batch_size=3, context_len="ragged:1-260", tree="random:40:3", page_size=128, tree_per_request="mixed"),
    dict(batch_size=2, context_len=129, tree="chain:6", page_size=16, num_q_heads=8, num_kv_heads=1),
    dict(batch_size=1, context_len=0, tree="full:2:1", page_size=128),
]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("kw", CASES, ids=lambda kw: f"B{kw['batch_size']}-P{kw['page_size']}-{kw['tree']}")
@pytest.mark.parametrize("cls", [FA4Tree, FA4Causal], ids=["fa4_tree", "fa4_causal"])
def test_fa4_matches_the_reference(cls, kw, head_dim, dtype):
    axes = dict(num_q_heads=4, num_kv_heads=2, head_dim=head_dim, dtype=dtype, layout="shuffled")
    case = Case(**{**axes, **kw})
    backend = cls()
    reason = backend.availability() or backend.supports(case)
    if reason:
        pytest.skip(reason)
    config = RunConfig(mode="check", device="cuda", quiet=True)
    row = run_case_backend(backend, case, CaseData(case), None, torch.device("cuda"), config)
    print(f"\n{cls.name} {case.case_id}: {row['status']} kernel={row['kernel']} "
          f"max_abs_err={row['max_abs_err']} lse_max_abs_err={row['lse_max_abs_err']} {row['reason'] or ''}")
    assert row["status"] == "pass", row["reason"]
    assert row["kernel"] and row["kernel"].startswith("fa4 ")
    assert row["lse_max_abs_err"] is not None

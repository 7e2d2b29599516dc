"""Two-pass tree attention with FlashInfer's paged prefill as the inner kernel.

The method of `backends/two_pass.py` (SGLang's FA3 tree verify), each pass one
`BatchPrefillWithPagedKVCacheWrapper.run(..., return_lse=True)` (NHD, no mask,
non-causal; written against flashinfer-python 0.6.18.post1):

- pass 1, the context: request b's T_b queries over its pages holding [0, L_b);
- pass 2, the tree: each of the sum T_b nodes is its own request of one query,
  over a page-size-1 view of the pool (N * P, 1, Hkv, D) whose "pages" are the
  slots of its ancestors and itself (what SGLang's expanded page table does).

FlashInfer's LSE is base 2 (`prefill.cuh` and the Hopper `attention_updater.cuh`
write log2(sum) + max of the log2e-scaled scores), so both are multiplied by
ln 2 before the natural-log merge of `backends/_lse.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import torch

from treebench.backends._conversions import flashinfer_page_metadata, prefill_backend, prefix_sums, token_slots
from treebench.backends._lse import LN2, merge_states
from treebench.harness.adapter.contract import Backend, Capabilities, register
from treebench.harness.model.paged import BatchInputs

INSTALL_HINT = "flashinfer not installed: pip install -e '.[gpu]' from the treebench checkout"
WORKSPACE_BYTES = 128 * 1024 * 1024   # float workspace per wrapper, FlashInfer's recommended size


@register
class TwoPassFlashInfer(Backend):
    """Context pass + tree pass, each a FlashInfer paged prefill with its LSE, merged by LSE.

    Timed: the two `wrapper.run(q, kv, return_lse=True)` calls, the base-2 to
    natural LSE conversion, setting pass 1's LSE to -inf for requests with L_b = 0,
    and the float32 merge (a few elementwise kernels), cast to the input dtype.
    Setup (untimed): both passes' page metadata (int32) and `plan` calls, two
    128 MiB float workspaces (one per wrapper, reused across cases).

    L_b = 0: FlashInfer's paged layout has no empty request (a request owns at
    least one page, last_page_len in [1, P]), so such a request's pass 1 reads a
    one-token context, position 0 -- its tree root, a finite slot -- and its LSE
    is then replaced by -inf, which gives that state weight 0 in the merge.

    Per-request trees, ragged contexts; fp16/bf16, D 64/128/256; sm80+.
    """

    install_hint = INSTALL_HINT
    name = "two_pass_flashinfer"
    returns_lse = True      # the merged state's LSE (FlashInfer's base 2 converted to natural log)
    capabilities = Capabilities(
        devices=("cuda",),
        dtypes=("bfloat16", "float16"),
        head_dims=(64, 128, 256),          # head dims FlashInfer instantiates for prefill
        min_compute_capability=(8, 0),
    )

    def __init__(self) -> None:
        self._workspaces: list[torch.Tensor] = []

    @staticmethod
    def _wrapper_class() -> type:
        """FlashInfer's paged prefill wrapper (imported lazily; tests put a fake module in sys.modules)."""
        from flashinfer import BatchPrefillWithPagedKVCacheWrapper
        return BatchPrefillWithPagedKVCacheWrapper

    def load_optional(self) -> object:
        return self._wrapper_class()

    def _workspace(self, i: int, device: torch.device) -> torch.Tensor:
        """The i-th 128 MiB uint8 float workspace on `device` (i = 0, 1)."""
        if len(self._workspaces) < 2 or self._workspaces[0].device != device:
            self._workspaces = [torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device) for _ in range(2)]
        return self._workspaces[i]

    def prepare(self, inputs: BatchInputs) -> Callable[[], torch.Tensor]:
        """Plans both passes; returns the timed call.

        Raises:
            BackendUnavailable: flashinfer cannot be imported.
        """
        wrapper_cls = self.optional()
        plans = two_pass_plans(inputs)
        wrappers = []
        for i, plan in enumerate((plans.context, plans.tree)):
            w = wrapper_cls(self._workspace(i, inputs.device), "NHD")
            w.plan(*plan.positional, **plan.keywords)
            wrappers.append(w)
        n, P, Hkv, D = inputs.k_cache.shape
        pool = (inputs.k_cache, inputs.v_cache)                                           # (N, P, Hkv, D)
        slots = (inputs.k_cache.view(n * P, 1, Hkv, D), inputs.v_cache.view(n * P, 1, Hkv, D))
        q, empty, dtype = inputs.q, plans.empty_context, inputs.dtype

        def run() -> tuple[torch.Tensor, torch.Tensor]:
            o1, lse1 = wrappers[0].run(q, pool, return_lse=True)          # (sum T_b, Hq, D), (sum T_b, Hq) base 2
            o2, lse2 = wrappers[1].run(q, slots, return_lse=True)
            lse1 = torch.where(empty, float("-inf"), lse1 * LN2)          # L_b = 0: the empty state
            o, lse = merge_states(o1.float(), lse1, o2.float(), lse2 * LN2)
            return o.to(dtype), lse                                       # (sum T, Hq, D), (sum T, Hq) natural log

        run.kernel = "two-pass " + "/".join(prefill_backend(w) for w in wrappers)
        return run


def two_pass_plans(inputs: BatchInputs) -> SimpleNamespace:
    """Both passes' `plan` arguments for `inputs` (pure conversion).

    Returns:
        namespace with `context` and `tree`, each (positional, keywords) of
        `plan`, and `empty_context` (sum T_b, 1) bool, True on the rows of
        requests with L_b = 0. Context: qo_indptr = prefix sums of T_b, pages of
        max(L_b, 1) tokens through the block table, page size P. Tree: qo_indptr
        = 0..sum T_b (one query per node), kv_indptr = prefix sums of depth_i + 1,
        kv_indices (sum_i depth_i + 1,) int32 = pool slots of node i's ancestors
        and itself in tree order, last_page_len ones, page size 1. Both
        non-causal, no mask, q/kv data types = the input dtype, sm_scale.
    """
    ls, ts, _ = inputs.host_lists()
    _, P, Hkv, D = inputs.k_cache.shape
    Hq, dev = inputs.q.shape[1], inputs.device
    keywords = dict(causal=False, q_data_type=inputs.dtype, kv_data_type=inputs.dtype, sm_scale=inputs.sm_scale)
    ctx_indptr, ctx_indices, ctx_last = flashinfer_page_metadata(inputs.block_table, [max(l, 1) for l in ls], P)
    context = SimpleNamespace(positional=(inputs.qo_indptr.to(torch.int32), ctx_indptr, ctx_indices, ctx_last,
                                          Hq, Hkv, D, P), keywords=keywords)
    node_slots = token_slots(inputs.block_table, ls, ts, P).split(ts)         # B x (T_b,) slots of [L_b, S_b)
    rows = [s.to(dev).expand(t.size, -1)[t.ancestor_mask.to(dev)]             # row i: slots of j with mask[i, j]
            for s, t in zip(node_slots, inputs.trees)]
    counts = [d + 1 for t in inputs.trees for d in t.depths]                  # ancestors + itself per node
    n_nodes = sum(ts)
    tree = SimpleNamespace(positional=(
        torch.arange(n_nodes + 1, dtype=torch.int32, device=dev), prefix_sums(counts, dev),
        torch.cat(rows).to(torch.int32), torch.ones(n_nodes, dtype=torch.int32, device=dev),
        Hq, Hkv, D, 1), keywords=keywords)
    empty = torch.tensor([l == 0 for l, t in zip(ls, ts) for _ in range(t)], device=dev)[:, None]
    return SimpleNamespace(context=context, tree=tree, empty_context=empty)

"""xformers' Medusa/EAGLE tree attention over the paged cache.

Upstream: `xformers.ops.tree_attention.tree_attention` (xformers >= 0.0.29;
checked with 0.0.35), which splits the work in two and merges by LSE:

- prefix: the T queries against each request's L_b context tokens, read from the
  paged pool through `PagedBlockDiagonalPaddedKeysMask` (cache batch 1: the pool
  viewed as one (1, N * P, Hkv, G, D) sequence) by the Triton split-K op;
- suffix: the T queries against the tree's own T keys/values, handed over as
  dense (B, T, Hkv, G, D) tensors, with one (T, T) additive tree bias.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace

import torch

from treebench.backends._conversions import require_shared_tree, gather_tokens, token_slots, tree_additive_bias
from treebench.harness.adapter.contract import Backend, Capabilities, register
from treebench.harness.model.paged import BatchInputs

INSTALL_HINT = "xformers not installed: pip install -e '.[gpu]' from the treebench checkout"


@contextmanager
def fa4_hidden() -> Iterator[None]:
    """While xformers first imports: a `flash_attn` package without `flash_attn_interface` (the
    one FlashAttention-4 installs, `flash_attn.cute` alone) is hidden from
    `importlib.util.find_spec`.

    xformers 0.0.35's `ops/fmha/flash.py` imports `flash_attn.flash_attn_interface` (FA2's)
    whenever `find_spec("flash_attn")` finds a package, so beside FA4 `import xformers.ops`
    raised ModuleNotFoundError and xformers_tree was unavailable. Hidden, xformers takes the
    path it takes without flash_attn installed: torch's own FlashAttention-2. A real FA2
    install (with `flash_attn_interface`) is left as it is. Raises nothing of its own.
    """
    real = importlib.util.find_spec
    try:
        shadowed = real("flash_attn") is not None and real("flash_attn.flash_attn_interface") is None
    except (ImportError, ValueError):      # a broken flash_attn: let xformers meet it as it is
        shadowed = False
    if not shadowed:
        yield
        return

    def find_spec(name, package=None):
        return None if name == "flash_attn" else real(name, package)
    importlib.util.find_spec = find_spec
    try:
        yield
    finally:
        importlib.util.find_spec = real


@register
class XformersTree(Backend):
    """xformers `tree_attention`, prefix from the paged pool, suffix with a tree bias.

    Timed: one `tree_attention` call (prefix split-K kernel, suffix kernel, LSE
    merge) and the free reshape of its output to (sum T_b, Hq, D).
    Setup (untimed): gathering the tree's K/V (positions [L_b, S_b)) out of the
    pages into dense (B, T, Hkv, D) tensors -- a real engine writes them there
    when it appends them -- building the (T, T) bias and the paged prefix bias.

    Limits (each a skip with its reason): the Triton split-K paged path needs
    P % 64 == 0 (its BLOCK_N); the tree bias is one (T, T) tensor shared by the
    batch, so per-request trees are not supported; fp16/bf16 only; sm80+.
    `prefix_op` is passed explicitly: xformers' default dispatch
    (`select_prefix_op`) raises "TypeError: isinstance() arg 2 must be a type"
    on CUDA for paged biases.
    """

    install_hint = INSTALL_HINT
    name = "xformers_tree"
    capabilities = Capabilities(
        devices=("cuda",),
        dtypes=("bfloat16", "float16"),        # triton_splitk.FwOp.SUPPORTED_DTYPES
        page_size_multiple=64,                  # triton_splitk.FwOp.BLOCK_N for paged biases
        head_dims=(64, 128, 256),               # split-K supports 16..512 powers of two
        per_request_trees=False,                # spec_attn_bias is one (T, T) tensor
        min_compute_capability=(8, 0),
    )

    @staticmethod
    def _ops() -> SimpleNamespace:
        """The xformers entry points (imported lazily, FlashAttention-4's `flash_attn` hidden from
        it: `fa4_hidden`; tests swap in fakes)."""
        with fa4_hidden():
            from xformers.ops.fmha import triton_splitk
            from xformers.ops.fmha.attn_bias import PagedBlockDiagonalPaddedKeysMask
            from xformers.ops.tree_attention import tree_attention
        return SimpleNamespace(tree_attention=tree_attention, prefix_op=triton_splitk.FwOp,
                               paged_bias=PagedBlockDiagonalPaddedKeysMask)

    def load_optional(self) -> object:
        return self._ops()

    def prepare(self, inputs: BatchInputs) -> Callable[[], torch.Tensor]:
        """Builds the dense tree K/V and both biases; returns the timed call.

        Raises:
            BackendUnavailable: xformers cannot be imported.
            ConfigError: the batch's trees differ (one tree bias serves the batch).
        """
        ops = self.optional()
        args = xformers_arguments(inputs, ops.paged_bias)

        def run() -> torch.Tensor:
            out = ops.tree_attention(*args.tensors, prefix_op=ops.prefix_op)  # (B, T, Hkv, G, D)
            return out.reshape(args.out_shape)                                # (sum T, Hq, D)

        run.kernel = "xformers tree_attention (prefix: triton split-K)"
        return run


def xformers_arguments(inputs: BatchInputs, paged_bias_cls) -> SimpleNamespace:
    """Positional arguments of `tree_attention` for `inputs` (pure conversion).

    Returns:
        namespace with `tensors` = (q, spec_k, spec_v, cache_k, cache_v,
        spec_attn_bias, prefix_attn_bias) in xformers' BMGHK layout, where
        xformers' G is our Hkv and its H our group size G:
        q (B, T, Hkv, G, D) a view of inputs.q; spec_k/v (B, T, Hkv, G, D)
        expanded from gathered (B, T, Hkv, D); cache_k/v (1, N * P, Hkv, G, D)
        expanded views of the pool; spec_attn_bias (T, T) in the input dtype;
        prefix bias over L_b context tokens. `out_shape` = (sum T, Hq, D).

    Raises:
        ConfigError: requests carry different trees.
    """
    require_shared_tree(inputs, "xformers_tree", "its tree bias")
    trees = inputs.trees
    ls, ts, _ = inputs.host_lists()
    B, T = len(trees), ts[0]
    N, P, Hkv, D = inputs.k_cache.shape
    G = inputs.q.shape[1] // Hkv
    q = inputs.q
    if abs(inputs.sm_scale - D ** -0.5) > 1e-12:       # tree_attention has no scale argument
        q = q * (inputs.sm_scale * D ** 0.5)
    q = q.view(B, T, Hkv, G, D)                                        # head h = kv head h // G
    slots = token_slots(inputs.block_table, ls, ts, P)                # tree positions [L_b, S_b)
    spec = [gather_tokens(c, slots).view(B, T, Hkv, 1, D).expand(B, T, Hkv, G, D)
            for c in (inputs.k_cache, inputs.v_cache)]                # (B, T, Hkv, G, D)
    cache = [c.view(1, N * P, Hkv, 1, D).expand(1, N * P, Hkv, G, D)
             for c in (inputs.k_cache, inputs.v_cache)]               # (1, N*P, Hkv, G, D)
    bias = tree_additive_bias(trees[0], inputs.dtype).to(inputs.device)  # (T, T)
    prefix = paged_bias_cls.from_seqlens(q_seqlen=[T] * B, kv_seqlen=ls, block_tables=inputs.block_table,
                                         page_size=P, device=inputs.device)
    return SimpleNamespace(tensors=(q, spec[0], spec[1], cache[0], cache[1], bias, prefix),
                           out_shape=(B * T, Hkv * G, D))

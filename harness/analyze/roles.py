"""The parts backends play in a report, by name: the kernel it is about, treebench's own kernels
(never a rival of it), and the speedup baselines preferred when none is given.

Data only, importing nothing, so that `treebench report --help` names the defaults without
loading pandas or matplotlib; `treebench.harness.analyze.headline` and
`treebench.harness.analyze.report` apply them to rows.
"""

from __future__ import annotations

# treebench's own kernels (kernels/): never a rival in "best peer" or "fastest on".
OWN_KERNELS = ("triton_tree", "triton_tree_bias", "triton_causal")
DEFAULT_OWN = "triton_tree"   # the report's own backend where it has timed rows (--own names another)
DEFAULT_BASELINES = ("flashinfer_mask", "xformers_tree", "torch_sdpa")  # preferred speedup baselines, in order

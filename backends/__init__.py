"""Built-in adapters, one module each. Importing this package registers them all
(explicit imports, no discovery by path).

Every adapter module imports cleanly without its optional package (xformers,
flashinfer, triton): the package is imported inside the adapter, and a missing
one shows up as `availability()`'s reason, never as an import crash here.
"""

from treebench.backends import reference  # noqa: F401
from treebench.backends import torch_sdpa  # noqa: F401
from treebench.backends import flex  # noqa: F401
from treebench.backends import triton_tree  # noqa: F401
from treebench.backends import triton_tree_bias  # noqa: F401
from treebench.backends import triton_causal  # noqa: F401
from treebench.backends import xformers_tree  # noqa: F401
from treebench.backends import flashinfer_mask  # noqa: F401
from treebench.backends import causal_baseline  # noqa: F401
from treebench.backends import vllm_triton  # noqa: F401
from treebench.backends import two_pass  # noqa: F401
from treebench.backends import two_pass_flashinfer  # noqa: F401
from treebench.backends import sglang_triton  # noqa: F401
from treebench.backends import flashinfer_xqa  # noqa: F401
from treebench.backends import fa4_tree  # noqa: F401

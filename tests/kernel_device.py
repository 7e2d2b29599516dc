"""Where the Triton kernel tests run: a CUDA GPU, else Triton's CPU interpreter.

Import it before anything that imports Triton: without CUDA it sets TRITON_INTERPRET=1
(Triton reads it at import). A module importing it is skipped, as a whole, where Triton
is missing or where there is no GPU and the interpreter was turned off.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

triton = pytest.importorskip("triton")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no CUDA GPU and TRITON_INTERPRET is not 1", allow_module_level=True)

TINY = dict(num_q_heads=4, num_kv_heads=2, head_dim=64)    # G 2 with Hkv 2

"""The smallest suite the CLI tests run: one case of B 1, L 8, a 2-node chain, Hq 2, Hkv 1, D 16,
float32, P 16 (milliseconds per pair on a CPU); `tiny_suite` writes it as a TOML file."""

from __future__ import annotations

TINY = """
[suite]
name = "{name}"
[axes]
batch_size = [1]
context_len = [8]
tree = ["chain:2"]
num_q_heads = [2]
num_kv_heads = [1]
head_dim = [16]
dtype = ["float32"]
page_size = [16]
"""


def tiny_suite(name: str = "tiny", context_lens: tuple[int, ...] = (8,)) -> str:
    """TINY named `name`, with one case per context length in `context_lens`."""
    return TINY.format(name=name).replace("context_len = [8]", f"context_len = {list(context_lens)}")

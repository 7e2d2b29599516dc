"""xformers_tree beside FlashAttention-4: FA4's `flash_attn` (the `cute` subpackage alone) made
xformers 0.0.35's import fail (its fmha/flash.py imports `flash_attn.flash_attn_interface`
whenever a `flash_attn` package is found). Fakes of both packages, on the CPU."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from treebench.backends.xformers_tree import XformersTree, fa4_hidden

FLASH_PY = '''import importlib.util
if importlib.util.find_spec("flash_attn"):
    import flash_attn.flash_attn_interface   # as xformers 0.0.35 does
    FLASH = "flash_attn"
else:
    FLASH = "torch"
'''


@pytest.fixture
def fakes(tmp_path, monkeypatch):
    """A fake FA4 `flash_attn` (cute only) and a fake xformers whose fmha imports as 0.0.35's does."""
    files = {"flash_attn/cute/__init__.py": "",
             "xformers/__init__.py": "", "xformers/ops/__init__.py": "",
             "xformers/ops/fmha/__init__.py": "from . import flash\n",
             "xformers/ops/fmha/flash.py": FLASH_PY,
             "xformers/ops/fmha/triton_splitk.py": "class FwOp: pass\n",
             "xformers/ops/fmha/attn_bias.py": "class PagedBlockDiagonalPaddedKeysMask: pass\n",
             "xformers/ops/tree_attention.py": "def tree_attention(*a, **k): pass\n"}
    for rel, text in files.items():
        f = tmp_path / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m.split(".")[0] in ("xformers", "flash_attn")]:
        monkeypatch.delitem(sys.modules, name)
    yield tmp_path
    for name in [m for m in sys.modules if m.split(".")[0] in ("xformers", "flash_attn")]:
        del sys.modules[name]


def test_beside_fa4_xformers_imports_and_takes_torchs_flash_attention(fakes):
    with pytest.raises(ModuleNotFoundError, match="flash_attn_interface"):   # what happened before
        importlib.import_module("xformers.ops.fmha")
    for name in [m for m in sys.modules if m.startswith("xformers")]:
        del sys.modules[name]
    ops = XformersTree._ops()
    assert ops.prefix_op.__name__ == "FwOp"
    assert sys.modules["xformers.ops.fmha.flash"].FLASH == "torch"
    assert importlib.util.find_spec("flash_attn") is not None             # find_spec is itself again


def test_a_real_flash_attention_2_is_left_as_it_is(fakes):
    (fakes / "flash_attn" / "flash_attn_interface.py").write_text("")
    with fa4_hidden():
        importlib.import_module("xformers.ops.fmha")
    assert sys.modules["xformers.ops.fmha.flash"].FLASH == "flash_attn"

"""The peers' fp8 KV paths on the CPU, through the fakes of their upstream calls
(tests/test_peer_adapters*.py): the pool's fp8 dtype and both scales reach the call, and a
call that drops them fails against the reference."""

from __future__ import annotations

import dataclasses
import inspect
from types import SimpleNamespace

import pytest
import torch

from tests.test_peer_adapters import FakeFlashInferWrapper, assert_matches_reference, \
    fake_unified_attention, small_case
from tests.test_peer_adapters_more import fake_xqa, install, passes
from treebench.backends import flashinfer_xqa as fx
from treebench.backends.flashinfer_mask import FlashInferMask, flashinfer_plan_arguments
from treebench.backends.flashinfer_xqa import FlashInferXqa
from treebench.backends.vllm_triton import VllmTriton, vllm_arguments
from treebench.harness.errors import ConfigError
from treebench.harness.model.paged import build_inputs


def fp8_case(kv="float8_e4m3fn", **kw):
    return small_case(**{"dtype": "bfloat16", "kv_dtype": kv, "k_scale": 0.25, "v_scale": 0.5, "page_size": 16, **kw})


@pytest.mark.parametrize("values", ["random", "mean"])
def test_vllm_fp8_descales_and_quant_mode(monkeypatch, values):
    monkeypatch.setattr(VllmTriton, "_kernel", staticmethod(lambda: fake_unified_attention))
    inputs = build_inputs(fp8_case(batch_size=3, page_size=16, values=values))
    kw = vllm_arguments(inputs)
    assert kw["k"].dtype == torch.float8_e4m3fn and kw["q"].dtype == torch.bfloat16
    assert (kw["k_descale"] == 0.25).all() and (kw["v_descale"] == 0.5).all()
    assert kw["k_descale"].dtype == torch.float32
    assert_matches_reference(VllmTriton().prepare(inputs)(), inputs)


def test_vllm_fp8_without_the_quant_mode_is_caught(monkeypatch):
    """A newer kernel left at KVQuantMode.NONE casts the codes unscaled: the fake does too, and fails."""
    monkeypatch.setattr(VllmTriton, "_kernel", staticmethod(lambda: fake_unified_attention))
    monkeypatch.setattr(VllmTriton, "_fp8_quant_mode", staticmethod(lambda kernel: 0))
    inputs = build_inputs(fp8_case(batch_size=3, page_size=16))
    with pytest.raises(AssertionError):
        assert_matches_reference(VllmTriton().prepare(inputs)(), inputs)


def test_vllm_bf16_pool_passes_no_quant_mode(monkeypatch):
    seen = {}

    def kernel(**kw):
        seen.update(kw)
        return fake_unified_attention(**kw)
    kernel.__signature__ = inspect.signature(fake_unified_attention)
    monkeypatch.setattr(VllmTriton, "_kernel", staticmethod(lambda: kernel))
    inputs = build_inputs(small_case(dtype="bfloat16", batch_size=2, page_size=16))
    VllmTriton().prepare(inputs)()
    assert "kv_quant_mode" not in seen and (seen["k_descale"] == 1.0).all()


@pytest.mark.parametrize("kv", ["float8_e4m3fn", "float8_e5m2"])
def test_flashinfer_fp8_kv_data_type_and_scales(monkeypatch, kv):
    fake = SimpleNamespace(Wrapper=FakeFlashInferWrapper)
    monkeypatch.setattr(FlashInferMask, "_flashinfer", staticmethod(lambda: fake))
    inputs = build_inputs(fp8_case(kv, batch_size=4, tree_per_request="mixed", page_size=5))
    plan = flashinfer_plan_arguments(inputs)
    assert plan.keywords["kv_data_type"] == getattr(torch, kv) and plan.keywords["q_data_type"] == torch.bfloat16
    assert plan.run_keywords == {"k_scale": 0.25, "v_scale": 0.5}
    assert_matches_reference(FlashInferMask().prepare(inputs)(), inputs, lse_base=FlashInferMask.lse_base)
    assert flashinfer_plan_arguments(build_inputs(small_case(dtype="bfloat16"))).run_keywords == {}


def test_flashinfer_fp8_without_scales_is_caught():
    inputs = build_inputs(fp8_case(batch_size=2))
    plan = flashinfer_plan_arguments(inputs)
    w = FakeFlashInferWrapper(torch.empty(1, dtype=torch.uint8), "NHD")
    w.plan(*plan.positional, **plan.keywords)
    with pytest.raises(AssertionError):
        assert_matches_reference(w.run(inputs.q, (inputs.k_cache, inputs.v_cache)), inputs)


@pytest.mark.parametrize("case_kw", [dict(tree="full:2:2"), dict(tree_per_request="mixed", page_size=32),
                                     dict(values="mean")])
def test_xqa_fp8_kv_scale(monkeypatch, case_kw):
    install(monkeypatch, "flashinfer", xqa=fake_xqa)
    case = fp8_case(**{"k_scale": 0.5, **case_kw})
    assert FlashInferXqa().supports(case) is None
    inputs = build_inputs(case)
    semaphores = torch.zeros(4, dtype=torch.int32).view(torch.uint32)
    kw = fx.xqa_arguments(inputs, torch.zeros(8, dtype=torch.uint8), semaphores)
    assert kw["kv_scale"] == 0.5 and kw["k_cache"].dtype == torch.float8_e4m3fn
    assert passes(FlashInferXqa().prepare(inputs)(), inputs)
    kw["kv_scale"] = 1.0                                            # the scale dropped: the fake fails it
    fake_xqa(**kw)
    assert not passes(kw["output"].view(inputs.q.shape), inputs)


def test_xqa_refuses_unequal_scales():
    inputs = build_inputs(fp8_case())
    assert "one kv_scale" in FlashInferXqa().supports(inputs.case)
    with pytest.raises(ConfigError, match="one kv_scale"):
        fx.xqa_arguments(inputs, torch.zeros(8, dtype=torch.uint8), torch.zeros(4, dtype=torch.int32))
    assert "kv_dtype float8_e5m2 not supported" in FlashInferXqa().supports(dataclasses.replace(
        inputs.case, kv_dtype="float8_e5m2", k_scale=0.5))

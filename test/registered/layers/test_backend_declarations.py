"""Every attention backend allocates exactly what it declares, from the real inputs (tp, graph batch, kv splits,
slots), and the plan charges exactly that: declared bytes == allocated bytes == the plan's workspace term.

The GPU backends' allocation runs on the meta device through the same `allocate_buffers` their __init__ uses (their
kernel libraries are not needed); their __init__ itself is exercised with a stand-in kernel module."""

import dataclasses
import itertools
import sys
import unittest
from unittest import mock

from sglang.srt.layers.attention.attention_registry import create_attention_backend, get_attention_backend_class
from sglang.srt.mem_plan import PlanInputs, plan_memory
from sglang.srt.mem_plan.backends import (
    ATTENTION_BACKENDS,
    AttentionShape,
    BackendInputs,
    buffers_bytes,
    declare,
    persistent,
    workspace_spec,
)
from sglang.srt.server_args import ATTENTION_BACKEND_CHOICES
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="cpu")

GiB = 2**30


class FakePool:
    def __init__(self, size):
        self.size = size


def grid():
    # (q heads total, tp, graph batch, kv splits, slots)
    return itertools.product((32, 9), (1, 2, 8), (0, 1, 48, 256), (1, 8, 16), (1, 37, 2048))


def inputs_for(q_heads, tp, graph_bs, splits, slots, ctx=4096, mla=False):
    shape = AttentionShape(-(-q_heads // tp), 128 if not mla else 576, ctx, v_head_dim=512 if mla else None,
                           is_mla=mla, num_kv_splits=splits, architectures=("LlamaForCausalLM",))
    return BackendInputs(shape, slots, graph_bs, max_extend_tokens=2048, fused_cpu_decode=False)


class TestDeclaredEqualsAllocated(unittest.TestCase):
    def test_one_backend_list(self):
        self.assertEqual(tuple(ATTENTION_BACKEND_CHOICES), ATTENTION_BACKENDS)
        for name in ATTENTION_BACKENDS:
            self.assertEqual(get_attention_backend_class(name).backend_name, name)

    def test_grid_every_backend_on_meta(self):
        """declared persistent bytes == bytes allocated by the backend's allocate_buffers (meta tensors), and the
        plan's workspace term (linear fit) == all declared bytes, for every backend and grid point."""
        for name in ATTENTION_BACKENDS:
            cls = get_attention_backend_class(name)
            for q, tp, g, splits, slots in grid():
                for mla in (False, True):
                    x = inputs_for(q, tp, g, splits, slots, mla=mla)
                    decl = declare(name, x)
                    tensors = cls.allocate_buffers(decl, "meta")
                    got = sum(t.numel() * t.element_size() for t in tensors.values())
                    with self.subTest(backend=name, q=q, tp=tp, g=g, splits=splits, slots=slots, mla=mla):
                        self.assertEqual(got, buffers_bytes(persistent(decl)))
                        self.assertEqual(workspace_spec(name, x).bytes_for(slots, min(g, slots)), buffers_bytes(decl))

    def test_inputs_change_the_buffers(self):
        """tp, graph batch and kv splits reach the declaration (the old registry dropped them to defaults)."""
        base = inputs_for(32, 1, 256, 16, 2048)
        tri = buffers_bytes(declare("triton", base))
        self.assertLess(buffers_bytes(declare("triton", inputs_for(32, 1, 256, 8, 2048))), tri)
        self.assertLess(buffers_bytes(declare("triton", inputs_for(32, 2, 256, 16, 2048))), tri)
        self.assertLess(buffers_bytes(declare("triton", inputs_for(32, 1, 0, 16, 2048))), tri)
        self.assertLess(buffers_bytes(declare("flashinfer", dataclasses.replace(base, page_size=16))),
                        buffers_bytes(declare("flashinfer", base)))  # page ids: one per page, not per token

    def test_gpu_backend_init_allocates_the_plan(self):
        """A planned Triton backend built through create_attention_backend holds exactly the plan's workspace."""
        shape = AttentionShape(8, 64, 2048, num_kv_splits=16)
        spec = workspace_spec("triton", BackendInputs(shape, 0))
        plan = plan_memory(PlanInputs(pre_load_free_bytes=4 * GiB, weight_bytes=GiB, kv_cell_bytes=8192,
                                      context_len=2048, workspace=spec, cuda_graph_max_bs=48, max_running_requests=64))
        x = BackendInputs(shape, plan.max_running_requests, plan.cuda_graph_max_bs)
        cls = get_attention_backend_class("triton")
        with mock.patch.object(cls, "kernel_module", "math"):  # a stand-in for the kernel library
            backend = create_attention_backend("triton", model_config=None, req_to_token_pool=FakePool(64),
                                               token_to_kv_pool=None, device="meta", inputs=x)
        self.assertEqual(backend.allocated_bytes(), plan.bytes_of("attention_workspace"))
        self.assertEqual(backend.buffers["cuda_graph_attn_logits"].shape, (48, 8, 16, 64))
        with self.assertRaises(TypeError):  # GPU backends cannot be built without their planned inputs
            create_attention_backend("triton", model_config=None, req_to_token_pool=FakePool(64),
                                     token_to_kv_pool=None, device="meta")

    def test_kernels_imported_only_in_init(self):
        for name, lib in (("aiter", "aiter"), ("flashinfer", "flashinfer")):
            if lib in sys.modules:
                continue
            with self.assertRaises(ImportError):
                create_attention_backend(name, model_config=None, req_to_token_pool=FakePool(4), token_to_kv_pool=None,
                                         device="cpu", inputs=inputs_for(8, 1, 0, 8, 4))

    def test_torch_native_transients_are_charged_not_allocated(self):
        x = inputs_for(9, 1, 0, 8, 256)
        decl = declare("torch_native", x)
        self.assertEqual({b.name for b in decl}, {"extend_attention", "decode_gather"})
        self.assertTrue(all(b.transient for b in decl))
        self.assertEqual(workspace_spec("torch_native", x).fixed_bytes, buffers_bytes(decl))
        fused = BackendInputs(x.shape, 256, max_extend_tokens=2048, fused_cpu_decode=True, cpu_threads=3)
        decl = declare("torch_native", fused)
        self.assertEqual([b.name for b in decl], ["extend_attention"])
        # the fused kernels' extend (extend_attention_op.h): a bf16 query copy and output of 2048 x 9 heads x 128, and
        # 3 threads' scratch of 4 fp32 scores per key of a 4096-token sequence
        s = x.shape
        self.assertEqual(buffers_bytes(decl), 2 * 2048 * s.num_q_heads * 128 * s.model_dtype_bytes + 3 * 16 * 4096)
        self.assertLess(buffers_bytes(decl), buffers_bytes(declare("torch_native", x)) / 10)


if __name__ == "__main__":
    unittest.main()

"""Steps for an attention backend over the MLA latent pool, checked against the EXPANDED form in float64 by the
shared harness (sglang.test.mla_reference.MLAHarness). Not a test file (run_suite collects test_*.py only).

What this adds to the harness: the backend built with the plan's page size and CUDA-graph batch (mla_harness), one
sequence of steps (MLA_STEPS: prefill, extends over cached prefixes, decode steps, a late request), decode steps set
up by the backend's CUDA-graph capture hook instead of init_forward_metadata, and an allocation recorder around the
backend's calls only (not the reference's math).
"""

from __future__ import annotations

import contextlib
from typing import List

import torch

from sglang.srt.layers.attention.attention_registry import create_attention_backend
from sglang.srt.mem_plan.backends import BackendInputs
from sglang.test.mla_reference import MLAHarness

# prefill of three requests, an extend over their cached prefixes (one of a single token), two decode steps, then a
# fourth request joining while the others hold long prefixes
MLA_STEPS = [("abc", [5, 17, 9]), ("abc", [3, 1, 8]), ("abc", [1, 1, 1]), ("abc", [1, 1, 1]),
             ("abcd", [2, 1, 4, 11])]


def mla_harness(backend: str, *, page_size: int = 1, dtype=torch.float32, graph_bs: int = 0,
                num_heads: int = 8) -> MLAHarness:
    """The harness with its backend built from the inputs a start plans: this page size and graph batch."""
    h = MLAHarness(backend, page_size=page_size, dtype=dtype, num_heads=num_heads)
    inputs = BackendInputs(h.backend.inputs.shape, h.r2t.size, graph_bs, page_size=page_size)
    h.backend = create_attention_backend(backend, model_config=h.backend.model_config, req_to_token_pool=h.r2t,
                                         token_to_kv_pool=h.pool, device="cpu", inputs=inputs)
    return h


def worst_error(got: List[torch.Tensor], want: List[torch.Tensor]) -> float:
    """max |got - want| over every layer; a NaN (an output never written) counts as inf."""
    d = max(float((g - w).abs().max()) if g.numel() else 0.0 for g, w in zip(got, want))
    nan = any(bool(g.isnan().any()) for g in got)
    return float("inf") if nan or d != d else d


@contextlib.contextmanager
def backend_calls_in(h: MLAHarness, recorder=None, graph: bool = False):
    """While active, h.backend's metadata and forward calls run inside `recorder` (a context, e.g. an
    AllocationRecorder) and, with graph, a forward's metadata comes from its CUDA-graph capture hook."""
    b = h.backend
    around = recorder if recorder is not None else contextlib.nullcontext()
    init, forward = b.init_forward_metadata, b.forward

    def init_metadata(fb):
        with around:
            if graph and fb.forward_mode.is_decode():
                return b.init_forward_metadata_capture_cuda_graph(fb.batch_size, fb.req_pool_indices, fb.seq_lens_cpu)
            return init(fb)

    def forward_in(*args, **kwargs):
        with around:
            return forward(*args, **kwargs)

    b.init_forward_metadata, b.forward = init_metadata, forward_in
    try:
        yield
    finally:
        del b.init_forward_metadata, b.forward


def run_mla_steps(h: MLAHarness, graph_decode: bool = False) -> List[float]:
    """MLA_STEPS through h (graph_decode: decode steps through the CUDA-graph hook); the error of each step."""
    rows, errors = {}, []
    with backend_calls_in(h, graph=graph_decode):
        for names, lens in MLA_STEPS:
            for name in names:
                if name not in rows:
                    rows[name] = h.new_request()
            errors.append(worst_error(*h.step([rows[n] for n in names], lens)))
    return errors

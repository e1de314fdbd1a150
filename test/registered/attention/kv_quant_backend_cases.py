"""The Triton backend over a quantized KV pool, run in the Triton interpreter (interpreted_run.py kv_quant_backend):
per format, the BackendHarness steps (prefill, extend over a cached prefix, decode) through --attention-backend
triton and torch_native on the same pool, and one CUDA-graph decode (capture hook + the graph workspace) whose
kernel arguments are recorded. Not a test file."""

import torch
from kv_quant_triton_cases import FORMATS

from sglang.srt.mem_cache import kv_quant_codec
from sglang.test.attention_harness import BackendHarness, max_abs_diff

STEPS = [[5, 17, 9], [3, 1, 8], [1, 1, 1], [1, 1, 1]]


def _storages(tensors) -> set:
    return {t.untyped_storage().data_ptr() for t in tensors}


def _recording(ops, log):
    """A stand-in for backend.ops whose decode_attention_fwd records its arguments, then runs the kernel."""

    class Ops:
        extend_attention_fwd = staticmethod(ops.extend_attention_fwd)

        @staticmethod
        def decode_attention_fwd(*args, **kwargs):
            log.append((args, kwargs))
            return ops.decode_attention_fwd(*args, **kwargs)

    return Ops


def one_format(fmt: str, keys_turned: bool = True) -> dict:
    """keys_turned=False: an fp8 pool whose scales are a checkpoint's (keys stored plain, the query not turned)."""
    h = BackendHarness("triton", page_size=16, dtype=torch.float32, kv_format=fmt, num_q_heads=6, num_kv_heads=2,
                       head_dim=32, graph_bs=2, num_reqs=4, pool_tokens=512)
    pool, backend = h.pool, h.backend
    if pool.is_fp8:  # per-(layer, head) scales, as calibration leaves them
        pool.load_scales(torch.tensor([[0.02, 0.05], [0.03, 0.01]]), torch.tensor([[0.01, 0.04], [0.05, 0.02]]),
                         "test", keys_turned=keys_turned)
    if "k_smooth" in pool.fixed:  # int4's key multipliers, as calibration leaves them (not 1: the query must divide)
        gen = torch.Generator().manual_seed(7)
        w = torch.exp(torch.randn(pool.fixed["k_smooth"].shape, generator=gen) * 0.5)
        pool.fixed["k_smooth"].copy_(w / w.mean(-1, keepdim=True))
    rows = [h.new_request() for _ in range(3)]
    diffs = []
    for new_lens in STEPS:
        got, want = h.step(rows, new_lens)
        diffs.append(max_abs_diff(got, want))
    # CUDA-graph decode of batch 2: the capture hook, then one forward through the graph workspace
    log = []
    backend.ops = _recording(backend.ops, log)
    fb = h.batch(rows[:2], [1, 1])
    backend.init_forward_metadata_capture_cuda_graph(2, fb.req_pool_indices, fb.seq_lens_cpu)
    qkv = h.qkv(2)
    fb.attn_backend = backend  # no init_forward_metadata: the capture hook set the graph's metadata
    got = [backend.forward(q, k, v, layer, fb) for layer, (q, k, v) in zip(h.layers, qkv)]
    want = h.run(h.reference, fb, qkv)
    pool_storages = _storages(list(pool.fields.values()) + list(pool.fixed.values()))
    graph_ws = backend.buffers["cuda_graph_attn_logits"]
    kv_args = [a[1]["kv"] for a in log]
    rotation = backend.buffers.get("kv_rotation")
    return {
        "step_diffs": diffs,
        "graph_diff": max_abs_diff(got, want),
        "graph_launches": len(log),
        "graph_kv_are_pool_buffers": all(_storages(kv.tensors()) <= pool_storages for kv in kv_args),
        "graph_kv_codes_per_layer": [kv.k.data_ptr() == pool.fields["k"][i].data_ptr() for i, kv in enumerate(kv_args)],
        "graph_uses_graph_workspace": all(a[0][7].data_ptr() == graph_ws.data_ptr() for a in log),
        "graph_grid_all_splits": all(a[1]["max_seq_len"] is None for a in log),
        # the current token's K/V as computed (the merge folds them in), not its codes
        "graph_fresh_kv": all(a[1]["k_new"] is not None and a[1]["v_new"] is not None for a in log),
        "rotation_parts": sorted(backend.rotations),
        "pool_turned_parts": sorted(pool.turned_parts),
        "rotation_in_planned_buffer": rotation is not None and all(
            r.untyped_storage().data_ptr() == rotation.untyped_storage().data_ptr()
            for r in backend.rotations.values()),
        "rotation_equals_pool": all(torch.equal(r, kv_quant_codec.rotation(r.shape[0])) for r in backend.rotations.values()),
    }


def backend_results() -> dict:
    from sglang.srt.layers.attention.triton_ops.interpreter_blas import use_single_threaded_blas

    use_single_threaded_blas()
    results = {fmt: one_format(fmt) for fmt in FORMATS}
    results["fp8_e4m3 plain keys"] = one_format("fp8_e4m3", keys_turned=False)
    return results

"""The Triton backend over a quantized KV pool, run in the Triton interpreter (interpreted_run.py kv_quant_backend):
per format, the BackendHarness steps (prefill, extend over a cached prefix, decode) through --attention-backend
triton and torch_native on the same pool (the window formats with their recent window and sinks, as a server has
them: the 60-token prompt reads sinks, codes and ring; int4 once without), and CUDA-graph decode as the runner drives
it (the capture hook once, then forwards over the graph's input tensors, the graph workspace), its kernel arguments
and any host sync recorded. Not a test file."""

import torch
from kv_quant_triton_cases import FORMATS
from torch.utils._python_dispatch import TorchDispatchMode

from sglang.srt.mem_cache import kv_quant_codec
from sglang.test.attention_harness import BackendHarness, max_abs_diff

STEPS = [[5, 60, 9], [3, 1, 8], [1, 1, 1], [1, 1, 1]]


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


class HostSyncs(TorchDispatchMode):
    """Records what would wait for the device or give a data-dependent shape (neither can be captured in a CUDA
    graph): .item() / int() / bool() of a tensor, tolist(), nonzero, boolean-mask indexing, repeat_interleave
    without output_size."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __enter__(self):
        self._tolist = torch.Tensor.tolist
        torch.Tensor.tolist = lambda t: (self.seen.append("tolist"), self._tolist(t))[1]
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist = self._tolist
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func.overloadpacket.__name__)
        masks = name in ("index", "index_put", "index_put_") and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1])
        if masks or name in ("_local_scalar_dense", "nonzero", "masked_select") or (
                name == "repeat_interleave" and kwargs.get("output_size") is None):
            self.seen.append(name)
        return func(*args, **kwargs)


def _graph_decode(h: BackendHarness, rows, steps: int = 2) -> dict:
    """CUDA-graph decode of batch 2: the capture hook once, then `steps` forwards over the graph's input tensors (the
    runner's warm-up and capture forwards share one metadata; a replay only changes those tensors' contents), each
    the next decode step, against torch_native over the same ring."""
    backend, log, diffs, syncs = h.backend, [], [], []
    backend.ops = _recording(backend.ops, log)
    fb = h.batch(rows[:2], [1, 1])
    backend.init_forward_metadata_capture_cuda_graph(2, fb.req_pool_indices, fb.seq_lens_cpu)
    fb.attn_backend = backend  # no init_forward_metadata: the capture hook set the graph's metadata
    tail_left_to_forward = backend.forward_metadata.tail is None
    for i in range(steps):
        step = fb if i == 0 else h.batch(rows[:2], [1, 1])
        for name in ("req_pool_indices", "seq_lens", "out_cache_loc", "positions"):
            getattr(fb, name).copy_(getattr(step, name))
        qkv = h.qkv(2)

        def forward():
            with HostSyncs() as mode:
                out = [backend.forward(q, k, v, layer, fb) for layer, (q, k, v) in zip(h.layers, qkv)]
            syncs.extend(mode.seen)
            return out

        got, want = h.compare(step, qkv, forward)
        diffs.append(max_abs_diff(got, want))
    return dict(log=log, diffs=diffs, syncs=sorted(set(syncs)), tail_left_to_forward=tail_left_to_forward,
                ring_diffs=h.ring_diffs[-steps:])


def one_format(fmt: str, keys_turned: bool = True, window: bool = True) -> dict:
    """keys_turned=False: an fp8 pool whose scales are a checkpoint's (keys stored plain, the query not turned);
    window=False: an int4 / int2_hadamard pool without its recent window."""
    h = BackendHarness("triton", page_size=16, dtype=torch.float32, kv_format=fmt, num_q_heads=6, num_kv_heads=2,
                       head_dim=32, graph_bs=2, num_reqs=4, pool_tokens=512, window=window)
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
    step_ring_diffs = list(h.ring_diffs)
    graph = _graph_decode(h, rows)
    log, window = graph["log"], getattr(pool, "window", None)
    rings, layers = [a[1]["ring"] for a in log], h.num_layers
    counts = [getattr(r, "counts", None) for r in rings]
    pool_storages = _storages(list(pool.fields.values()) + list(pool.fixed.values()))
    graph_ws = backend.buffers["cuda_graph_attn_logits"]
    kv_args = [a[1]["kv"] for a in log]
    rotation = backend.buffers.get("kv_rotation")
    return {
        "step_diffs": diffs,
        "graph_diff": max(graph["diffs"]),
        "graph_launches": len(log),
        "window": window is not None,
        # the backend's ring after each step / graph forward vs torch_native's (equal slots, K/V within bf16 rounding)
        "step_ring_diffs": step_ring_diffs,
        "graph_ring_diffs": graph["ring_diffs"],
        "graph_host_syncs": graph["syncs"],
        "graph_tail_left_to_forward": graph["tail_left_to_forward"],
        # every graph launch reads the window's own ring buffers, this layer's (None without a window)
        "graph_ring_is_window": all(
            (r is None) if window is None else (r is not None and r.k.data_ptr() == window.k[i % layers].data_ptr()
                                                and r.v.data_ptr() == window.v[i % layers].data_ptr())
            for i, r in enumerate(rings)),
        # one tail per forward, shared by its layers (the second forward made its own)
        "graph_tail_per_forward": window is None or [
            [counts[f * layers + i] is counts[f * layers] for i in range(layers)] + [
                counts[f * layers] is not counts[(f - 1) * layers]] for f in range(1, len(rings) // layers)],
        "graph_kv_are_pool_buffers": all(_storages(kv.tensors()) <= pool_storages for kv in kv_args),
        "graph_kv_codes_per_layer": [kv.k.data_ptr() == pool.fields["k"][i % layers].data_ptr()
                                     for i, kv in enumerate(kv_args)],
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
    results["int4 no window"] = one_format("int4", window=False)
    return results

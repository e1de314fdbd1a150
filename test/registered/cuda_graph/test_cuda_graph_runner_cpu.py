"""CUDA-graph decode logic on a CPU (model_executor/cuda_graph_runner.py). A CPU has no CUDA graphs: these tests run
the runner with the EagerGraphFactory stand-in, which records every capture/replay and runs the captured callable
eagerly, copying into the captured output as a real replay does. They check the WIRING (which sizes are captured,
padding, static-buffer copies, where the dummy rows read and write, the measure -> plan -> check decision) and that
a padded replay computes the same tokens as eager decode; they do not check CUDA-graph capture itself (the CUDA suite
does: test_cuda_graph_gpu.py).

  * pure functions: capture buckets, padding, static-buffer fill, the plan-vs-measured verdict;
  * a fake model + fake backend in this process: replayed logits == eager logits for the live rows, and the padded
    rows write KV slot 0 only;
  * end to end (child process, Triton interpreter, fp32): a small random-weight Qwen3 through sglang.Engine with
    --attention-backend triton, decode graphs up to batch 8 vs --disable-cuda-graph: same greedy tokens for decode
    batches of 1, 3 (padded to 4), 5 (padded to 8) and 9 (over the largest graph: eager); each padded replay changes
    only the live rows' KV slots and the dummy slot 0; the plan's cuda_graphs term is measured (dry capture before
    the plan) and /server_info says what ran.
"""

import pytest
from graph_run import run_in_child
import torch

from sglang.srt.model_executor.cuda_graph_runner import (
    DUMMY_KV_SLOT, DUMMY_REQ_ROW, CudaGraphRunner, EagerGraphFactory, StaticInputs, capture_batch_sizes,
    check_graph_memory, graph_memory_error, padded_batch_size)
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import make_random_qwen3

register_cpu_ci(est_time=45, suite="cpu")



# ------------------------------------------------------------------ pure functions
def test_capture_batch_sizes():
    assert capture_batch_sizes(0) == []
    assert capture_batch_sizes(1) == [1]
    assert capture_batch_sizes(3) == [1, 2, 3]
    assert capture_batch_sizes(8) == [1, 2, 4, 8]
    assert capture_batch_sizes(20) == [1, 2, 4, 8, 16, 20]
    sizes = capture_batch_sizes(600)
    assert sizes[:6] == [1, 2, 4, 8, 16, 24] and sizes[-1] == 600
    steps = {b - a for a, b in zip(sizes[4:], sizes[5:-1])}
    assert steps == {8, 16, 32}
    for max_bs in (1, 7, 8, 9, 160, 256, 257, 512, 777):
        sizes = capture_batch_sizes(max_bs)
        assert sizes == sorted(set(sizes)) and sizes[-1] == max_bs
        # every batch 1..max_bs pads to a captured size at most one bucket step above it
        for bs in range(1, max_bs + 1):
            p = padded_batch_size(bs, sizes)
            assert p >= bs and p in sizes and (p - bs) < max(bs, 32)
        assert padded_batch_size(max_bs + 1, sizes) is None


def _decode_batch(ids, positions, rows, seq_lens, locs) -> ForwardBatch:
    t = lambda x: torch.tensor(x, dtype=torch.int64)  # noqa: E731
    return ForwardBatch(forward_mode=ForwardMode.DECODE, batch_size=len(ids), input_ids=t(ids), positions=t(positions),
                        req_pool_indices=t(rows), seq_lens=t(seq_lens), out_cache_loc=t(locs), seq_lens_cpu=seq_lens)


def test_static_inputs_pad_to_the_dummy_row_and_slot():
    s = StaticInputs.allocate(8, "cpu")
    s.input_ids.fill_(99)  # stale contents of an earlier, larger batch
    s.out_cache_loc.fill_(99)
    s.copy_batch(_decode_batch([5, 6, 7], [10, 3, 4], [2, 1, 3], [11, 4, 5], [40, 41, 42]), 4)
    assert s.input_ids[:4].tolist() == [5, 6, 7, 0]
    assert s.positions[:4].tolist() == [10, 3, 4, 0]
    assert s.req_pool_indices[:4].tolist() == [2, 1, 3, DUMMY_REQ_ROW]
    assert s.seq_lens[:4].tolist() == [11, 4, 5, 1]
    assert s.out_cache_loc[:4].tolist() == [40, 41, 42, DUMMY_KV_SLOT]
    assert s.out_cache_loc[4:].tolist() == [99] * 4  # rows past the padded size are not read by graph 4


def test_graph_memory_verdict():
    ok = check_graph_memory(planned_bytes=100 << 20, measured_bytes=90 << 20, slack_bytes=0)
    assert ok.fits and ok.excess_bytes == 0
    absorbed = check_graph_memory(planned_bytes=100 << 20, measured_bytes=110 << 20, slack_bytes=64 << 20)
    assert absorbed.fits and absorbed.excess_bytes == 10 << 20
    short = check_graph_memory(planned_bytes=100 << 20, measured_bytes=300 << 20, slack_bytes=64 << 20)
    assert not short.fits
    msg = graph_memory_error(short, 256)
    assert "--cuda-graph-max-bs" in msg and "--disable-cuda-graph" in msg and "256" in msg


def test_which_runs_get_graphs():
    from sglang.srt.mem_plan.build import DeviceFacts, resolve_cuda_graph_max_bs
    from sglang.srt.model_executor.model_runner_kv_cache_mixin import ModelRunnerKVCacheMixin
    from sglang.srt.server_args import ServerArgs

    gpu = DeviceFacts("cuda", 70 << 30, 80 << 30)
    cpu = DeviceFacts("cpu", 16 << 30, 32 << 30)
    graph_bs = lambda device, **kw: resolve_cuda_graph_max_bs(ServerArgs(**kw), device)  # noqa: E731
    assert graph_bs(gpu, attention_backend="triton") > 0
    assert graph_bs(gpu, attention_backend="flashinfer", cuda_graph_max_bs=24) == 24
    assert graph_bs(gpu, attention_backend="triton", disable_cuda_graph=True) == 0
    assert graph_bs(gpu, attention_backend="torch_native") == graph_bs(gpu, attention_backend="aiter") == 0
    with pytest.raises(ValueError, match="must be resolved"):  # a GPU plan never guesses the backend
        graph_bs(gpu)
    assert graph_bs(cpu, attention_backend="triton", cuda_graph_max_bs=8) == 0
    runner = ModelRunnerKVCacheMixin()  # what /server_info reports on a CPU
    runner.device, runner.server_args = "cpu", ServerArgs()
    assert runner.graph_factory() is None
    assert runner.cuda_graph_info() == {"enabled": False, "reason": "cpu: no CUDA graphs here, decode runs eagerly"}


def test_tensor_parallel_runs_decode_eagerly_and_an_explicit_graph_size_is_refused():
    """Graph capture with the TP collectives inside (plain torch.distributed NCCL calls) is not shown by any run, so
    --tp-size > 1 resolves to no graphs in the one rule `sglang plan` and the server share, and asking for graphs
    with --cuda-graph-max-bs is refused at argument parsing (ServerArgs.validate: serve, Engine and plan alike)."""
    import contextlib
    import io
    import json
    import os

    from sglang.cli.plan import main as plan_main
    from sglang.srt.mem_plan.build import DeviceFacts, resolve_cuda_graph_max_bs
    from sglang.srt.server_args import ServerArgs

    gpu = DeviceFacts("cuda", 70 << 30, 80 << 30)
    for backend in ("triton", "flashinfer"):
        assert resolve_cuda_graph_max_bs(ServerArgs(attention_backend=backend, tp_size=2), gpu) == 0
        assert resolve_cuda_graph_max_bs(ServerArgs(attention_backend=backend, tp_size=1), gpu) > 0
    with pytest.raises(ValueError) as e:
        ServerArgs(tp_size=2, cuda_graph_max_bs=8)
    for needle in ("--cuda-graph-max-bs 8 with --tp-size 2", "torch.distributed", "decode runs eagerly",
                   "Drop --cuda-graph-max-bs", "--tp-size 1"):
        assert needle in str(e.value), str(e.value)
    ServerArgs(tp_size=2, cuda_graph_max_bs=8, disable_cuda_graph=True)  # graphs off: nothing to refuse
    ServerArgs(tp_size=1, cuda_graph_max_bs=8)
    from sglang.srt.model_executor.model_runner_kv_cache_mixin import ModelRunnerKVCacheMixin

    runner = ModelRunnerKVCacheMixin()  # what /server_info says on a GPU rank of a TP=2 server
    runner.device, runner.server_args, runner.moe_workspace = "cuda", ServerArgs(tp_size=2), None
    runner.graph_factory = lambda: object()  # a device that has graphs
    reason = runner.cuda_graph_info()["reason"]
    assert reason.startswith("--tp-size 2: ") and "torch.distributed" in reason, reason

    llama = os.path.join(os.path.dirname(__file__), "..", "mem_plan", "fixtures", "llama-3.1-8b")

    def plan(*extra):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = plan_main(["--model-path", llama, "--gpu", "h100-80gb", "--json", *extra])
            except SystemExit as exit_:
                return exit_.code, err.getvalue()
        return status, json.loads(out.getvalue())

    for tp, graph_bs in (("1", 256), ("2", 0)):
        status, d = plan("--tp", tp, "--attention-backend", "triton")
        terms = {t["name"]: t["num_bytes"] for t in d["plan"]["terms"]}
        assert status == 0 and d["plan"]["cuda_graph_max_bs"] == graph_bs, (tp, d["plan"]["cuda_graph_max_bs"])
        assert (terms["cuda_graphs"] > 0) == (graph_bs > 0)
    status, err = plan("--tp", "2", "--cuda-graph-max-bs", "64")
    assert status == 2 and "--cuda-graph-max-bs 64 with --tp-size 2" in err, err


def test_the_dry_run_graph_term_holds_the_shared_logits():
    """`sglang plan`'s cuda_graphs term (a formula before a server measures it): G x 2 MiB for the graphs' own
    activations plus the one fp32 [G, V] logits buffer every graph size shares (what the runner holds above)."""
    from sglang.srt.mem_plan.build import CUDA_GRAPH_BYTES_PER_BS, DeviceFacts, ModelFacts, formula_terms
    from sglang.srt.mem_plan.model_shapes import model_shape_from_config
    from sglang.srt.server_args import ServerArgs

    import json
    import os

    cfg = json.load(open(os.path.join(os.path.dirname(__file__), "..", "mem_plan", "fixtures", "llama-3.1-8b",
                                      "config.json")))
    model = ModelFacts(model_shape_from_config(cfg), 8192, "bfloat16", "bfloat16")
    gpu = DeviceFacts("cuda", 70 << 30, 80 << 30)
    for graph_bs in (8, 160, 256):
        sa = ServerArgs(attention_backend="triton", cuda_graph_max_bs=graph_bs)
        vocab = cfg["vocab_size"]
        assert formula_terms(sa, model, gpu).cuda_graph_bytes == graph_bs * (CUDA_GRAPH_BYTES_PER_BS + vocab * 4)


# ------------------------------------------------------------------ fake model + backend (wiring)
class FakeBackend:
    """Records the hooks; reads and writes a [slots] 'KV pool' through req_to_token like a real decode kernel."""

    backend_name = "fake"

    def __init__(self):
        self.calls = []

    def init_forward_metadata_capture_cuda_graph(self, bs, req_pool_indices, seq_lens_cpu, rows_cpu=None):
        self.calls.append(("capture", bs, list(seq_lens_cpu)))

    def init_forward_metadata_replay_cuda_graph(self, bs, req_pool_indices, seq_lens_cpu, rows_cpu=None):
        self.calls.append(("replay", bs, list(seq_lens_cpu)))


def _fake_model(kv: torch.Tensor, r2t: torch.Tensor, vocab: int):
    weight = torch.randn(vocab, generator=torch.Generator().manual_seed(0))

    def forward(input_ids, positions, fb):
        kv.index_copy_(0, fb.out_cache_loc, (input_ids * 10 + positions).float())  # "write K/V"
        rows = r2t[fb.req_pool_indices]  # [B, ctx]
        mask = torch.arange(r2t.shape[1])[None, :] < fb.seq_lens[:, None]
        ctx = (kv[rows] * mask).sum(1)  # "attend" over the request's first seq_len slots
        return torch.outer(ctx, weight)  # [B, V]

    return forward


def test_padded_replay_matches_eager_and_writes_only_the_dummy_slot():
    slots, ctx, vocab = 64, 8, 5
    r2t = torch.zeros(6, ctx, dtype=torch.int64)
    for row in range(1, 6):  # request row r owns slots 8r .. 8r+7
        r2t[row] = torch.arange(8 * row, 8 * row + ctx)
    kv = torch.randn(slots)
    forward, backend, factory = _fake_model(kv, r2t, vocab), FakeBackend(), EagerGraphFactory()
    runner = CudaGraphRunner(forward, backend, None, None, max_bs=4, device="cpu", factory=factory)
    runner.capture()
    assert [e for e in factory.events] == [("capture", 4), ("capture", 2), ("capture", 1)]
    assert [c[:2] for c in backend.calls] == [("capture", 4), ("capture", 2), ("capture", 1)]

    fb = _decode_batch([3, 4, 5], [2, 5, 1], [1, 3, 4], [3, 6, 2], [10, 29, 33])
    kv_eager = kv.clone()
    eager = _fake_model(kv_eager, r2t, vocab)(fb.input_ids, fb.positions, fb)
    kv_before = kv.clone()
    got = runner.replay(fb)
    assert factory.events[-1] == ("replay", 4) and backend.calls[-1] == ("replay", 4, [3, 6, 2, 1])
    torch.testing.assert_close(got, eager)
    changed = set((kv != kv_before).nonzero().view(-1).tolist())
    assert changed <= {10, 29, 33, DUMMY_KV_SLOT} and {10, 29, 33} <= changed
    assert torch.equal(kv[1:], kv_eager[1:])  # everything but the dummy slot as after an eager forward
    assert runner.can_run(fb) and not runner.can_run(_decode_batch(*[[1] * 5] * 5))


@pytest.mark.parametrize("max_bs", [1, 8, 64, 160])
def test_graph_outputs_hold_one_logits_buffer_whatever_the_number_of_sizes(max_bs):
    from sglang.srt.mem_plan.sizes import cuda_graph_logits_bytes

    vocab = 1000
    weight = torch.randn(vocab, generator=torch.Generator().manual_seed(1))
    forward = lambda ids, positions, fb: torch.outer((ids * 10 + positions).float(), weight)  # noqa: E731
    runner = CudaGraphRunner(forward, FakeBackend(), None, None, max_bs=max_bs, device="cpu",
                             factory=EagerGraphFactory())
    report = runner.capture()
    assert sorted(runner.graphs) == capture_batch_sizes(max_bs)
    # the bytes the captured outputs keep alive, each storage once: G x V x 4, not the sum over sizes of P x V x 4
    held = {g.output.untyped_storage().data_ptr(): g.output.untyped_storage().nbytes() for g in runner.graphs.values()}
    assert sum(held.values()) == max_bs * vocab * 4 == cuda_graph_logits_bytes(max_bs, vocab) == report.output_bytes
    # replays of every size, larger and smaller in turn, each return the eager logits of their live rows
    for bs in sorted({1, max_bs, (max_bs + 1) // 2, 3 if max_bs >= 3 else 1}, reverse=True) + [1, max_bs]:
        fb = _decode_batch(list(range(5, 5 + bs)), list(range(bs)), [0] * bs, [1] * bs, [0] * bs)
        got = runner.replay(fb)
        torch.testing.assert_close(got, forward(fb.input_ids, fb.positions, fb), rtol=0, atol=0)
        assert got.data_ptr() == runner.logits.data_ptr()


# ------------------------------------------------------------------ end to end (Triton interpreter)
MAX_NEW = 4
BATCHES = [
    [[(i * 13) % 400 + 3 for i in range(n)] for n in (5, 40, 17)],  # decode bs 3 -> graph 4
    [[(i * 7 + j) % 450 + 2 for i in range(9 + 11 * j)] for j in range(5)],  # bs 5 -> graph 8
    [[(i * 5 + j) % 300 + 4 for i in range(6 + j)] for j in range(9)],  # bs 9 > 8: eager
    [[11, 12, 13, 14]],  # bs 1 -> graph 1, no padding
]
# every batch prefills in one forward (the largest, 9 + 20 + 31 + 42 + 53 = 155 tokens, fits in 160), so each decode
# batch holds the whole batch; a 160-token chunk also keeps the startup profile forward short under the interpreter
ENGINE_KW = dict(skip_tokenizer_init=True, max_total_memory_gb=1, chunked_prefill_size=160, cuda_graph_max_bs=8)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    path = make_random_qwen3(str(tmp_path_factory.mktemp("qwen3") / "m"))
    return run_in_child(path, ENGINE_KW, BATCHES, MAX_NEW)


def test_graphs_give_the_eager_tokens(runs):
    g, e = runs["graphs"], runs["eager"]
    assert all(len(o) == MAX_NEW for batch in g["outputs"] for o in batch)
    assert g["outputs"] == e["outputs"]
    assert g["num_retractions"] == e["num_retractions"] == 0


def test_captures_and_padded_replays(runs):
    g = runs["graphs"]
    captures = [bs for kind, bs in g["events"] if kind == "capture"]
    assert captures == [8, 4, 2, 1] * 2  # the dry capture on scratch pools, then the one over the real pools
    replays = [bs for kind, bs in g["events"] if kind == "replay"]
    steps = MAX_NEW - 1  # the first token comes from the prefill
    # the 9-request batch decodes eagerly; before the batches, the engine's warm-up request batch replays too
    live = [w["bs"] for w in g["writes"]]
    assert live == [3] * steps + [5] * steps + [1] * steps
    assert replays[-len(live):] == [4] * steps + [8] * steps + [1] * steps
    assert g["cuda_graphs"]["enabled"] and g["cuda_graphs"]["batch_sizes"] == [1, 2, 4, 8]
    assert g["cuda_graphs"]["num_replays"] == len(replays)
    assert "cuda_graph_attn_logits" in g["graph_buffers"]
    assert runs["eager"]["events"] == [] and runs["eager"]["cuda_graphs"] == {"enabled": False,
                                                                              "reason": "--disable-cuda-graph"}


def test_padded_rows_write_only_the_dummy_slot(runs):
    writes = runs["graphs"]["writes"]
    assert len(writes) == 3 * (MAX_NEW - 1)
    for w in writes:
        changed, live = set(w["changed"]), set(w["live"])
        assert live <= changed <= live | {DUMMY_KV_SLOT}, w
        padded = padded_batch_size(w["bs"], [1, 2, 4, 8])
        assert (DUMMY_KV_SLOT in changed) == (padded > w["bs"]), w


def test_graph_memory_is_a_measured_plan_term(runs):
    g, e = runs["graphs"], runs["eager"]
    assert g["plan_graph_bs"] == 8 and g["graph_term"]["source"] == "measured"
    assert g["cuda_graphs"]["planned_bytes"] == g["graph_term"]["num_bytes"]
    assert e["plan_graph_bs"] == 0 and e["graph_term"]["num_bytes"] == 0

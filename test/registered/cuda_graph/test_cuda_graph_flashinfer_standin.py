"""CUDA-graph decode through the FlashInfer backend's capture/replay hooks, on CPU. WIRING, not CUDA: the runner
(model_executor/cuda_graph_runner.py) uses the EagerGraphFactory stand-in, and `flashinfer` is the stand-in module of
sglang.test.attention_standins (real signatures; it checks the fixed CUDA-graph buffers and the page tables it is
handed, and computes attention with torch from them). A two-layer "model" of attention layers whose q/k/v are fixed
functions of (token id, position) is captured at batch sizes 1, 2, 4 and replayed for live batches of 3 and 2
requests with long cached prefixes: the padded replay's live rows equal torch_native's attention over the same pools,
each graph batch replans its own captured wrapper (fixed buffers, batch = the padded size), and the padded row's
page table is the dummy page (page 0, one token)."""

import torch

from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner, EagerGraphFactory
from sglang.test.attention_harness import BackendHarness, max_abs_diff
from sglang.test.attention_standins import install, make_flashinfer
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="cpu")

BF16_TOL = 2e-2  # as test_flashinfer_wiring.py: a wrong key set is off by O(0.1..1)
VOCAB = 97


def _model(h: BackendHarness):
    """forward(input_ids, positions, fb) -> [B, layers * H * D] fp32: each layer's attention of q/k/v looked up from
    (token, position), through whichever backend fb carries (the graph runner sets the planned one)."""
    g = torch.Generator().manual_seed(1)
    tables = [[torch.randn(VOCAB, n, h.head_dim, generator=g) for n in (h.num_q_heads, h.num_kv_heads,
                                                                      h.num_kv_heads)] for _ in h.layers]

    def forward(input_ids, positions, fb):
        outs = []
        for layer, (tq, tk, tv) in zip(h.layers, tables):
            scale = (1 + positions.float() / 64).view(-1, 1, 1)
            q, k, v = [(t[input_ids] * scale).to(h.dtype) for t in (tq, tk, tv)]
            outs.append(fb.attn_backend.forward(q, k, v, layer, fb).float())
        return torch.cat(outs, dim=-1)

    return forward


def test_padded_flashinfer_replay_matches_torch_native():
    with install(make_flashinfer()) as fi:
        h = BackendHarness("flashinfer", page_size=4, graph_bs=4, num_reqs=6, pool_tokens=512)
        rows = [h.new_request() for _ in range(3)]
        h.step(rows, [7, 13, 30])  # cached prefixes over several pages
        forward = _model(h)
        runner = CudaGraphRunner(forward, h.backend, h.r2t, h.pool, max_bs=4, device="cpu",
                                 factory=EagerGraphFactory())
        runner.capture()
        graph_wrappers = {bs: w for bs, w in h.backend.graph_decode_wrappers.items()}
        assert sorted(graph_wrappers) == [1, 2, 4]
        for live in (rows, rows[:2], rows):  # 3 -> graph 4 (one dummy row), 2 -> graph 2, 3 again
            fb = h.batch(live, [1] * len(live))
            fb.input_ids = torch.tensor([11, 42, 7][: len(live)])
            fb.attn_backend = h.backend
            got = runner.replay(fb)
            padded = 4 if len(live) == 3 else 2
            plan = fi.calls.named("decode_plan")[-1]
            assert plan["wrapper"] is graph_wrappers[padded]
            assert len(plan["last_page_len"]) == padded
            if padded > len(live):  # the dummy row: one page, page 0, one token
                assert plan["indptr"][-1] - plan["indptr"][-2] == 1
                assert int(plan["indices"][int(plan["indptr"][-2])]) == 0
                assert int(plan["last_page_len"][-1]) == 1
            fb.attn_backend = h.reference
            h.reference.init_forward_metadata(fb)
            want = forward(fb.input_ids, fb.positions, fb)
            assert got.shape == want.shape == (len(live), 2 * h.num_q_heads * h.head_dim)
            assert max_abs_diff([got], [want]) < BF16_TOL
        assert runner.num_replays == 3

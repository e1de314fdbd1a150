"""CUDA-graph decode with a quantized KV cache (--kv-cache-dtype int4: codes, per-token scales and the key rotation)
through --attention-backend triton on CPU: the graph_run.py child (Triton interpreter; EagerGraphFactory stand-in for
the graphs, see test_cuda_graph_runner_cpu.py for what is and is not checked on a CPU) runs sglang.Engine with decode
graphs up to batch 4 and with --disable-cuda-graph: the same greedy tokens for a decode batch of 3 (padded to 4);
padded replays write only the live rows' KV slots and the dummy slot 0; the captured graphs read
the pool's own buffers (test_triton_kv_quant_backend.py checks the kernel arguments per format)."""

import pytest
from graph_run import run_in_child

from sglang.srt.model_executor.cuda_graph_runner import DUMMY_KV_SLOT
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import make_random_qwen3

register_cpu_ci(est_time=25, suite="cpu")

MAX_NEW = 4
BATCHES = [[[(i * 13) % 400 + 3 for i in range(n)] for n in (5, 40, 17)]]  # decode bs 3 -> graph 4
ENGINE_KW = dict(skip_tokenizer_init=True, max_total_memory_gb=1, chunked_prefill_size=512, cuda_graph_max_bs=4,
                 kv_cache_dtype="int4")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    path = make_random_qwen3(str(tmp_path_factory.mktemp("qwen3") / "m"))
    return run_in_child(path, ENGINE_KW, BATCHES, MAX_NEW)


def test_int4_graphs_give_the_eager_tokens(runs):
    g, e = runs["graphs"], runs["eager"]
    assert all(len(o) == MAX_NEW for batch in g["outputs"] for o in batch)
    assert g["outputs"] == e["outputs"]
    assert g["cuda_graphs"]["enabled"] and g["cuda_graphs"]["batch_sizes"] == [1, 2, 4]
    replays = [bs for kind, bs in g["events"] if kind == "replay"]
    assert replays[-(MAX_NEW - 1):] == [4] * (MAX_NEW - 1)


def test_padded_rows_write_only_the_dummy_slot(runs):
    writes = runs["graphs"]["writes"]
    assert [w["bs"] for w in writes] == [3] * (MAX_NEW - 1)
    for w in writes:
        changed, live = set(w["changed"]), set(w["live"])
        assert live <= changed <= live | {DUMMY_KV_SLOT}, w

"""GPU: CUDA-graph decode (model_executor/cuda_graph_runner.py) on the default model, for each graph backend of this
platform (triton in fp32 and bf16, flashinfer in bf16):
  * graphs on vs --disable-cuda-graph: the same greedy tokens, for decode batches that pad (3 -> 4, 5 -> 8, 13 -> 16),
    one that fits a graph exactly and one larger than the largest graph (eager);
  * memory: the plan's cuda_graphs term is measured (a dry capture on scratch pools before the KV pool is planned);
    the capture over the real pools takes no more than it (within the plan's safety margin).
Skips on a machine without a CUDA GPU, with the reason (fails instead inside the GPU suite); a backend whose
library does not import fails."""

import unittest

from sglang.test.ci.ci_register import register_cuda_ci
from sglang.test.gpu_backends import free_gpu_memory, require_library, requires_gpu

register_cuda_ci(est_time=240, suite="stage-a-test-1-gpu")

MAX_BS = 16
PROMPT_SETS = {  # decode batch size -> prompts (token ids, varied lengths)
    n: [[(i * 31 + j * 7) % 20000 + 100 for i in range(8 + 37 * j)] for j in range(n)] for n in (3, 5, 8, 13, 20)
}
SAMPLING = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
CONFIGS = [("triton", "float32"), ("triton", "bfloat16"), ("flashinfer", "bfloat16")]


def _run(backend: str, dtype: str, disable: bool) -> dict:
    import sglang

    engine = sglang.Engine(attention_backend=backend, dtype=dtype, cuda_graph_max_bs=MAX_BS,
                           disable_cuda_graph=disable, max_total_tokens=65536, max_running_requests=64,
                           log_level="warning", skip_tokenizer_init=True)
    try:
        runner = engine.scheduler.model_runner
        outs = {n: [o["output_ids"] for o in engine.generate(input_ids=p, sampling_params=SAMPLING)]
                for n, p in PROMPT_SETS.items()}
        info = engine.get_server_info()
        return {"outputs": outs, "cuda_graphs": info["cuda_graphs"], "plan": info["memory_plan"],
                "num_replays": getattr(runner.cuda_graph_runner, "num_replays", 0)}
    finally:
        engine.shutdown()
        free_gpu_memory()


@requires_gpu("cuda")
class TestCudaGraphs(unittest.TestCase):
    def test_graphs_on_vs_off(self):
        for backend, dtype in CONFIGS:
            with self.subTest(backend=backend, dtype=dtype):
                require_library(backend)
                on, off = _run(backend, dtype, False), _run(backend, dtype, True)
                self.assertTrue(on["cuda_graphs"]["enabled"], on["cuda_graphs"])
                self.assertEqual(on["cuda_graphs"]["batch_sizes"], [1, 2, 4, 8, 16])
                self.assertGreater(on["num_replays"], 0)
                self.assertEqual(off["cuda_graphs"], {"enabled": False, "reason": "--disable-cuda-graph"})
                if dtype == "float32":
                    self.assertEqual(on["outputs"], off["outputs"])
                else:  # bf16: graphs and eager may pick different kernels' rounding; nearly every token agrees
                    pairs = [(a, b) for n in PROMPT_SETS for x, y in zip(on["outputs"][n], off["outputs"][n])
                             for a, b in zip(x, y)]
                    self.assertGreaterEqual(sum(a == b for a, b in pairs) / len(pairs), 0.9)

    def test_graph_memory_plan_vs_measured(self):
        for backend, dtype in CONFIGS:
            with self.subTest(backend=backend, dtype=dtype):
                require_library(backend)
                r = _run(backend, dtype, False)
                plan, graphs = r["plan"], r["cuda_graphs"]
                term = {t["name"]: t for t in plan["terms"]}["cuda_graphs"]
                margin = {t["name"]: t for t in plan["terms"]}["safety_margin"]["num_bytes"]
                print(backend, dtype, "graphs planned", graphs["planned_bytes"], "measured", graphs["measured_bytes"])
                self.assertEqual(term["source"], "measured")
                self.assertEqual(term["num_bytes"], graphs["planned_bytes"])
                self.assertGreater(graphs["planned_bytes"], 0)
                self.assertLessEqual(graphs["measured_bytes"], graphs["planned_bytes"] + margin)
                self.assertEqual(plan["cuda_graph_max_bs"], MAX_BS)


if __name__ == "__main__":
    unittest.main()

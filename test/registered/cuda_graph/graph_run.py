"""Child process of test_cuda_graph_runner_cpu.py: sglang.Engine with --attention-backend triton under the Triton
interpreter (TRITON_INTERPRET=1 must be in the environment from the start, see test/registered/attention/
interpreted_run.py), once with decode "graphs" and once with --disable-cuda-graph, on the same prompts.

WIRING, not CUDA: a CPU has no CUDA graphs, so two things are patched here, and only here --
  * mem_plan.build.resolve_cuda_graph_max_bs honours --cuda-graph-max-bs on a CPU (normally 0 there),
  * ModelRunner.graph_factory returns the EagerGraphFactory stand-in (records capture/replay, runs eagerly).
Everything else is the server's own code: the dry capture on scratch pools before the plan, the plan's cuda_graphs
term, the capture over the real pools, padding to the next captured size, the static buffers, the Triton backend's
capture/replay hooks and graph workspace, the dummy request row and KV slot. Prints one RESULT_JSON line.
"""

import json
import os
import subprocess
import sys

import torch

RESULT_PREFIX = "RESULT_JSON:"


def run_in_child(model_path, engine_kwargs, batches, max_new_tokens) -> dict:
    """The parent's side: run this file in a child under the Triton interpreter and return its RESULT_JSON."""
    args = json.dumps(dict(model_path=model_path, engine_kwargs=engine_kwargs, batches=batches,
                           max_new_tokens=max_new_tokens))
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, os.path.abspath(__file__), args], env=env, capture_output=True, text=True,
                         timeout=900)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    assert out.returncode == 0 and lines, f"{out.stdout[-3000:]}\n{out.stderr[-5000:]}"
    return json.loads(lines[-1][len(RESULT_PREFIX):])


def patch_for_cpu_graphs(factory):
    from sglang.srt.mem_plan import build
    from sglang.srt.model_executor.model_runner_kv_cache_mixin import ModelRunnerKVCacheMixin

    build.resolve_cuda_graph_max_bs = lambda sa, device: 0 if sa.disable_cuda_graph else (sa.cuda_graph_max_bs or 0)
    ModelRunnerKVCacheMixin.graph_factory = lambda self: factory


def watch_dummy_writes(runner, log):
    """Wrap runner.replay: record, per replay, which KV rows of layer 0 changed and which the live batch owns."""
    from sglang.srt.model_executor.cuda_graph_runner import DUMMY_KV_SLOT

    replay = runner.replay

    def watched(fb):
        k = runner.token_to_kv_pool.k_buffer[0]
        # the dummy row always writes the same K (token 0 at position 0): mark the slot so a write shows
        saved = k[DUMMY_KV_SLOT].clone()
        k[DUMMY_KV_SLOT] = 7.0
        before = k.clone()
        out = replay(fb)
        changed = (k != before).flatten(1).any(dim=1).nonzero().view(-1).tolist()
        if DUMMY_KV_SLOT not in changed:
            k[DUMMY_KV_SLOT] = saved
        log.append({"bs": fb.batch_size, "changed": changed, "live": fb.out_cache_loc.tolist()})
        return out

    runner.replay = watched


def run(model_path, engine_kwargs, batches, max_new_tokens):
    from sglang import Engine
    from sglang.srt.model_executor.cuda_graph_runner import EagerGraphFactory

    factory = EagerGraphFactory()
    patch_for_cpu_graphs(factory)
    sampling = {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True}
    result = {}
    for name, extra in (("graphs", {}), ("eager", {"disable_cuda_graph": True})):
        engine = Engine(model_path=model_path, dtype="float32", attention_backend="triton", log_level="warning",
                        **engine_kwargs, **extra)
        try:
            runner = engine.scheduler.model_runner
            writes = []
            if runner.cuda_graph_runner is not None:
                watch_dummy_writes(runner.cuda_graph_runner, writes)
            outs = [[o["output_ids"] for o in engine.generate(input_ids=b, sampling_params=sampling)]
                    for b in batches]
            engine.scheduler.check_integrity()
            info = engine.get_server_info()
            plan_terms = {t["name"]: t for t in info["memory_plan"]["terms"]}
            result[name] = {
                "outputs": outs, "cuda_graphs": info["cuda_graphs"], "graph_term": plan_terms["cuda_graphs"],
                "plan_graph_bs": info["memory_plan"]["cuda_graph_max_bs"], "writes": writes,
                "graph_buffers": sorted(n for n in runner.attn_backend.buffers if n.startswith("cuda_graph")),
                "events": list(factory.events), "num_retractions": engine.scheduler.num_retractions,
            }
            factory.events.clear()
        finally:
            engine.shutdown()
    return result


if __name__ == "__main__":
    torch.manual_seed(0)
    print(RESULT_PREFIX + json.dumps(run(**json.loads(sys.argv[1]))), flush=True)

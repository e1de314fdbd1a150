"""The package's layer order, declared here and checked over every import in python/sglang -- module-level,
inside functions and under `if TYPE_CHECKING:` alike: a module imports only its own layer and the layers below it,
and no import circle exists anywhere (not even inside a layer). docs/architecture.md draws the same order.
Also: only the scheduler's owners import the Scheduler, and the runner's one device-placement step moves every
tensor of a ForwardBatch."""

import ast
import pathlib
import unittest
from typing import Dict, List, Set, Tuple

import torch

import sglang
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode, move_to_device
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=3, suite="cpu")

# Top to bottom. A module belongs to the layer of its longest matching prefix; every module must match one.
LAYERS: List[Tuple[str, Tuple[str, ...]]] = [
    ("tools", ("sglang", "sglang.cli", "sglang.launch_server", "sglang.bench_serving", "sglang.bench_utils",
               "sglang.bench_serving_client", "sglang.bench_cpu_burner", "sglang.bench_running_batch",
               "sglang.bench_one_batch", "sglang.bench_offline_throughput", "sglang.test")),
    ("entrypoints: HTTP app, OpenAI API, Engine", ("sglang.srt.entrypoints",)),
    ("launch: process groups", ("sglang.srt.launch",)),
    ("managers: tokenizer manager, scheduler, TP follower loop", ("sglang.srt.managers",
                                                                  "sglang.srt.distributed.tp_worker")),
    ("speculative decoding: proposers, verification", ("sglang.srt.speculative",)),
    ("model executor: runner, CUDA graphs, TP batch sync", ("sglang.srt.model_executor",
                                                           "sglang.srt.distributed.batch_sync")),
    ("model loader", ("sglang.srt.model_loader",)),
    ("models", ("sglang.srt.models",)),
    ("multimodal", ("sglang.srt.multimodal",)),
    ("settings: ServerArgs, model config, resolution", ("sglang.srt.configs", "sglang.srt.server_args",
                                                        "sglang.srt.server_args_cli", "sglang.srt.server_args_checks",
                                                        "sglang.srt.speculative.spec_args",
                                                        "sglang.srt.utils")),
    ("layers: attention backends, linear, quantization", ("sglang.srt.layers",
                                                          "sglang.srt.model_loader.weight_utils")),
    ("batch types", ("sglang.srt.model_executor.forward_batch_info",)),
    ("sampling", ("sglang.srt.sampling", "sglang.srt.metrics")),
    ("constrained decoding", ("sglang.srt.constrained",)),
    ("tool calls and reasoning", ("sglang.srt.function_call", "sglang.srt.parser")),
    ("pools, request parameters, errors", ("sglang.srt.mem_cache", "sglang.srt.sampling.sampling_params",
                                           "sglang.srt.sampling.validation", "sglang.srt.sampling.validation_errors",
                                           "sglang.srt.managers.request_error")),
    ("memory plan", ("sglang.srt.mem_plan",)),
    ("communication, kernels", ("sglang.srt.distributed", "sglang.jit_kernel", "sglang.version", "sglang.srt")),
]
SCHEDULER_OWNERS = {"sglang.srt.managers.scheduler_process", "sglang.srt.entrypoints.engine", "sglang.test.meta_runner"}
ROOT = pathlib.Path(sglang.__file__).resolve().parent


def package_modules() -> Dict[str, pathlib.Path]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        name = ".".join(("sglang",) + path.relative_to(ROOT).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def import_graph(modules: Dict[str, pathlib.Path]) -> Dict[str, Set[Tuple[str, int]]]:
    """module -> {(imported module, line)} for every sglang import anywhere in its source. `from pkg import name`
    counts as importing pkg.name when that is a module, else pkg."""

    def owner(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph: Dict[str, Set[Tuple[str, int]]] = {}
    for mod, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sglang"):
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    edges.add((sub if sub in modules else owner(node.module), node.lineno))
            elif isinstance(node, ast.Import):
                edges.update((owner(a.name), node.lineno) for a in node.names if a.name.startswith("sglang"))
        graph[mod] = {(m, line) for m, line in edges if m and m != mod}
    return graph


def layer_of(module: str) -> int:
    """Index of the layer (0 = top) whose longest prefix matches, or -1 when none does."""
    best, best_len = -1, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best_len:
                best, best_len = i, len(p)
    return best


def upward_imports(graph: Dict[str, Set[Tuple[str, int]]]) -> List[str]:
    out = []
    for mod, edges in sorted(graph.items()):
        for dst, line in sorted(edges):
            if layer_of(dst) < layer_of(mod):
                out.append(f"{mod}:{line} imports {dst} ({LAYERS[layer_of(mod)][0]} -> {LAYERS[layer_of(dst)][0]})")
    return out


def cycles(graph: Dict[str, Set[Tuple[str, int]]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    succ = {m: sorted({d for d, _ in e if d in graph}) for m, e in graph.items()}
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]
    for root in succ:
        if root in index:
            continue
        work = [(root, iter(succ[root]))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        x = stack.pop()
                        on_stack.discard(x)
                        comp.append(x)
                        if x == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
            elif w not in index:
                index[w] = low[w] = counter[0]
                counter[0] += 1
                stack.append(w)
                on_stack.add(w)
                work.append((w, iter(succ[w])))
            elif w in on_stack:
                low[v] = min(low[v], index[w])
    return found


class TestLayering(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.modules = package_modules()
        cls.graph = import_graph(cls.modules)

    def test_every_module_has_a_layer(self):
        self.assertEqual([m for m in self.modules if layer_of(m) < 0], [])

    def test_no_upward_import(self):
        self.assertEqual(upward_imports(self.graph), [])

    def test_no_import_cycle(self):
        self.assertEqual(cycles(self.graph), [])

    def test_the_checks_can_fail(self):
        """An upward import and a circle planted in a copy of the real graph are both reported."""
        graph = {m: set(e) for m, e in self.graph.items()}
        self.assertEqual(upward_imports(graph), [])
        graph["sglang.srt.mem_plan.planner"].add(("sglang.srt.managers.scheduler", 1))
        self.assertEqual(len(upward_imports(graph)), 1)
        self.assertIn("sglang.srt.mem_plan.planner", sum(cycles(graph), []))

    def test_only_owners_import_the_scheduler(self):
        importers = {m for m, e in self.graph.items() if any(d == "sglang.srt.managers.scheduler" for d, _ in e)}
        self.assertLessEqual(importers, SCHEDULER_OWNERS)

    def test_move_to_device_moves_every_tensor(self):
        fb = ForwardBatch(ForwardMode.DECODE, 2, torch.tensor([1, 2]), torch.tensor([3, 4]), torch.tensor([1, 2]),
                          torch.tensor([4, 5]), torch.tensor([7, 8]), seq_lens_cpu=[4, 5])
        move_to_device(fb, "meta")
        for name in ("input_ids", "positions", "req_pool_indices", "seq_lens", "out_cache_loc"):
            self.assertEqual(getattr(fb, name).device.type, "meta", name)
        self.assertEqual(fb.seq_lens_cpu, [4, 5])  # host lists stay on the host
        self.assertIsNone(fb.extend_seq_lens)


if __name__ == "__main__":
    unittest.main()

"""No import cycle between forward_batch_info, base_attn_backend and radix_attention, nor among the scheduler's parts
(TYPE_CHECKING imports count; only the scheduler's owners import it), and the model runner's one device-placement
step moves every tensor of a ForwardBatch."""

import ast
import importlib.util
import unittest

import torch

from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode, move_to_device
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=2, suite="cpu")

MODULES = (
    "sglang.srt.model_executor.forward_batch_info",
    "sglang.srt.layers.attention.base_attn_backend",
    "sglang.srt.layers.radix_attention",
)

SCHEDULER_PARTS = tuple(f"sglang.srt.managers.{m}" for m in (
    "scheduler", "request_queues", "req_memory", "fault_confinement", "output_sink", "prefill_scheduler",
    "decode_memory", "batch_runner", "overlap_worker", "schedule_batch")) + ("sglang.srt.constrained.scheduler_hooks",)
SCHEDULER_OWNERS = {"sglang.srt.managers.scheduler_process", "sglang.srt.entrypoints.engine", "sglang.test.meta_runner"}


def imported_modules(name: str) -> set:
    """Every sglang module a module imports anywhere in its source (inside `if TYPE_CHECKING:` too)."""
    tree = ast.parse(open(importlib.util.find_spec(name).origin).read())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sglang"):
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("sglang"))
    return out


class TestLayering(unittest.TestCase):
    def test_no_cycle(self):
        edges = {m: imported_modules(m) & set(MODULES) for m in MODULES}
        for a in MODULES:
            for b in edges[a]:
                self.assertNotIn(a, edges[b], f"import cycle {a} <-> {b}")
        self.assertEqual(edges["sglang.srt.model_executor.forward_batch_info"], set())

    def test_scheduler_parts_form_no_cycle(self):
        edges = {m: imported_modules(m) & set(SCHEDULER_PARTS) for m in SCHEDULER_PARTS}
        done, on_path = set(), []

        def visit(m):
            if m in on_path:
                self.fail(f"import cycle {' -> '.join(on_path[on_path.index(m):] + [m])}")
            if m in done:
                return
            on_path.append(m)
            for n in edges[m]:
                visit(n)
            on_path.pop()
            done.add(m)

        for m in SCHEDULER_PARTS:
            visit(m)
        importers = {m for m in SCHEDULER_PARTS if "sglang.srt.managers.scheduler" in imported_modules(m)}
        self.assertEqual(importers, set(), "a scheduler part imports the Scheduler")

    def test_only_owners_import_the_scheduler(self):
        import pathlib

        import sglang

        root = pathlib.Path(sglang.__file__).parent
        importers = set()
        for path in root.rglob("*.py"):
            name = "sglang." + ".".join(path.relative_to(root).with_suffix("").parts)
            if "sglang.srt.managers.scheduler" in imported_modules(name.removesuffix(".__init__")):
                importers.add(name)
        self.assertLessEqual(importers, SCHEDULER_OWNERS)

    def test_sampling_does_not_import_managers(self):
        for name in ("sglang.srt.sampling.sampler", "sglang.srt.sampling.sampling_params",
                     "sglang.srt.sampling.validation", "sglang.srt.sampling.validation_errors"):
            managers = {m for m in imported_modules(name) if m.startswith("sglang.srt.managers")}
            self.assertEqual(managers, set(), f"{name} imports {managers}: sampling <-> managers cycle")

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

"""Every collective on the right process group, without a real process group.

With --tp-size > 1 on CUDA the default (WORLD) group is NCCL, which reduces only CUDA tensors, and the TP group's
cpu_group is gloo, which reduces only CPU tensors; pickled objects travel as CPU tensors on gloo (upstream keeps
object collectives on the CPU group). torch.distributed's collectives and the TP group are replaced by recording
stand-ins: each call notes (function, group, what it carried) and computes what a 2-rank group would. Device
tensors are `meta` tensors standing for CUDA. Every CPU tensor and object must reach the gloo marker, every device
tensor the NCCL marker; a collective the stand-ins do not know fails the test. A source scan keeps every
torch.distributed collective inside communication_op.py, whose helpers are all exercised here.
"""

import ast
import contextlib
import pickle
import unittest
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import torch
import torch.distributed as dist

import sglang
from sglang.srt.distributed import communication_op as C
from sglang.srt.distributed import parallel_state
from sglang.srt.distributed.batch_sync import FORWARD, PING, pack_forward_batch, stop_message
from sglang.srt.distributed.parallel_state import TpGroup
from sglang.srt.mem_plan import measure
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="cpu")


class Marker:
    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


GLOO = Marker("gloo cpu_group")
NCCL = Marker("nccl device_group")
OBJECT = "pickled object"

# every torch.distributed function that talks to other ranks: none may reach the real (uninitialised) torch
COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_to_all", "all_to_all_single",
    "barrier", "batch_isend_irecv", "broadcast", "broadcast_object_list", "gather", "gather_object", "irecv",
    "isend", "monitored_barrier", "recv", "recv_object_list", "reduce", "reduce_scatter", "reduce_scatter_tensor",
    "scatter", "scatter_object_list", "send", "send_object_list",
)


class RecordingDist:
    """The collectives a rank of `tp` sees. The other ranks hold `peer_int` (integer reductions) or the same tensor;
    a follower (rank != src) receives the next object of `script` from a broadcast."""

    def __init__(self, tp: TpGroup, default_group, peer_int: int = 0, script=()):
        self.tp, self.default, self.peer_int, self.script = tp, default_group, peer_int, list(script)
        self.calls = []

    def _note(self, fn: str, group, what: str) -> None:
        self.calls.append((fn, self.default if group is None else group, what))

    def all_reduce(self, tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        self._note("all_reduce", group, tensor.device.type)
        if tensor.device.type == "meta":
            return None
        if op == dist.ReduceOp.MIN:
            tensor.clamp_(max=self.peer_int)
        elif op == dist.ReduceOp.MAX:
            tensor.clamp_(min=self.peer_int)
        else:
            tensor.mul_(self.tp.size)
        return None

    def all_gather(self, tensor_list, tensor, group=None, async_op=False):
        self._note("all_gather", group, tensor.device.type)
        if tensor.device.type != "meta":
            for part in tensor_list:
                part.copy_(tensor)

    def broadcast_object_list(self, object_list, src=0, group=None, device=None):
        self._note("broadcast_object_list", group, OBJECT)
        if self.tp.rank == src:
            pickle.dumps(object_list)  # what is sent must pickle
        else:
            object_list[0] = pickle.loads(pickle.dumps(self.script.pop(0)))

    def all_gather_object(self, object_list, obj, group=None):
        self._note("all_gather_object", group, OBJECT)
        object_list[:] = [pickle.loads(pickle.dumps(obj)) for _ in object_list]

    def destroy_process_group(self, group=None):
        self.calls.append(("destroy_process_group", group, None))

    def unknown(self, name: str):
        def refuse(*args, **kwargs):
            raise AssertionError(f"torch.distributed.{name} has no recording stand-in: add one to this test")

        return refuse


@contextlib.contextmanager
def stand_ins(device: str = "cuda", rank: int = 0, peer_int: int = 0, script=()):
    """A 2-rank TP group on `device` (cuda: device_group NCCL, cpu_group gloo; cpu: both gloo, as init_tp_group
    makes them), torch.distributed initialised, its collectives recorded."""
    device_group = NCCL if device == "cuda" else GLOO
    tp = TpGroup(rank, 2, device, device_group, GLOO)
    rec = RecordingDist(tp, default_group=device_group, peer_int=peer_int, script=script)
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(parallel_state, "_TP", tp))
        for name in COLLECTIVES + ("destroy_process_group",):
            if hasattr(dist, name):
                stack.enter_context(mock.patch.object(dist, name, getattr(rec, name, None) or rec.unknown(name)))
        stack.enter_context(mock.patch.object(dist, "is_initialized", lambda: True))
        stack.enter_context(mock.patch.object(dist, "is_available", lambda: True))
        yield rec


class CollectiveGroupCase(unittest.TestCase):
    def assert_right_groups(self, rec: RecordingDist, expect_calls: int) -> None:
        made = [c for c in rec.calls if c[0] != "destroy_process_group"]
        self.assertEqual(len(made), expect_calls, made)
        for fn, group, what in made:
            if what in ("cpu", OBJECT):
                carried = "a pickled object" if what == OBJECT else "a CPU tensor"
                self.assertIs(group, GLOO, f"{fn}: {carried} on {group} (NCCL only reduces CUDA tensors)")
            else:
                want = NCCL if rec.tp.device == "cuda" else GLOO
                self.assertIs(group, want, f"{fn}: a {what} (device) tensor on {group}, not the device group")


class TestMeasurementReductions(CollectiveGroupCase):
    def test_min_across_ranks(self):
        for device in ("cuda", "cpu"):
            with self.subTest(device=device), stand_ins(device, peer_int=7) as rec:
                self.assertEqual(measure.min_across_ranks(100), 7)
                self.assert_right_groups(rec, 1)

    def test_pre_load_free_bytes(self):
        with stand_ins("cuda", peer_int=1234) as rec:
            self.assertEqual(measure.pre_load_free_bytes("cpu", cap_bytes=1 << 30), 1234)
            self.assert_right_groups(rec, 1)

    def test_min_across_ranks_without_a_group(self):
        self.assertIsNone(parallel_state.get_tp_group())
        self.assertEqual(measure.min_across_ranks(123), 123)

    def test_tp_max_and_min_int(self):
        for device in ("cuda", "cpu"):
            with self.subTest(device=device), stand_ins(device, peer_int=50) as rec:
                self.assertEqual(C.tp_max_int(10), 50)
                self.assertEqual(C.tp_max_int(90), 90)
                self.assertEqual(C.tp_min_int(90), 50)
                self.assert_right_groups(rec, 3)


class TestTensorCollectives(CollectiveGroupCase):
    def test_device_tensors_on_the_device_group(self):
        with stand_ins("cuda") as rec:
            x = torch.empty(2, 3, device="meta")
            self.assertIs(C.tp_all_reduce(x), x)
            self.assertEqual(C.tp_all_gather(x, dim=-1).shape, (2, 6))
            self.assertEqual(C.tp_all_gather(x, dim=0).shape, (4, 3))
            self.assert_right_groups(rec, 3)

    def test_cpu_run(self):
        with stand_ins("cpu") as rec:
            x = torch.ones(2, 3)
            self.assertEqual(C.tp_all_reduce(x).tolist(), [[2.0] * 3] * 2)
            self.assertEqual(C.tp_all_gather(torch.arange(3.0)).tolist(), [0.0, 1.0, 2.0] * 2)
            self.assert_right_groups(rec, 2)

    def test_host_tensor_on_a_cuda_run_goes_to_gloo(self):
        with stand_ins("cuda") as rec:
            self.assertEqual(C.tp_all_reduce(torch.ones(2)).tolist(), [2.0, 2.0])
            self.assertEqual(C.tp_all_gather(torch.arange(2.0)).tolist(), [0.0, 1.0, 0.0, 1.0])
            self.assert_right_groups(rec, 2)

    def test_one_rank_is_the_identity(self):
        with stand_ins("cuda") as rec, mock.patch.object(parallel_state, "_TP", TpGroup(0, 1, "cuda", NCCL, GLOO)):
            x = torch.ones(2)
            self.assertIs(C.tp_all_reduce(x), x)
            self.assertIs(C.tp_all_gather(x), x)
            self.assertEqual(C.tp_all_gather_object("a"), ["a"])
            self.assertEqual(C.tp_broadcast_object("a"), "a")
            self.assertEqual((C.tp_max_int(3), C.tp_min_int(3), measure.min_across_ranks(3)), (3, 3, 3))
            self.assertEqual(rec.calls, [])


def pool(r2t: torch.Tensor) -> SimpleNamespace:
    return SimpleNamespace(req_to_token=r2t, req_to_token_host=r2t, window=None)  # a CPU pool: the host table is the table; no KV window


def decode_batch() -> ForwardBatch:
    return ForwardBatch(ForwardMode.DECODE, 2, torch.tensor([5, 6]), torch.tensor([3, 4]), torch.tensor([0, 1]),
                        torch.tensor([4, 5]), torch.tensor([9, 10]), seq_lens_cpu=[4, 5])


class TestObjectCollectives(CollectiveGroupCase):
    def test_helpers(self):
        for device in ("cuda", "cpu"):
            with self.subTest(device=device), stand_ins(device) as rec:
                self.assertEqual(C.tp_broadcast_object({"a": 1}), {"a": 1})
                self.assertEqual(C.tp_all_gather_object((0, "x")), [(0, "x"), (0, "x")])
                self.assert_right_groups(rec, 2)

    def test_model_runner_rank0(self):
        from sglang.srt.model_executor.model_runner import ModelRunner

        r2t = torch.zeros(2, 8, dtype=torch.int32)
        runner = SimpleNamespace(tp_size=2, req_to_token_pool=pool(r2t),
                                 forward_local=lambda fb: "logits")
        with stand_ins("cuda") as rec:
            self.assertEqual(ModelRunner.forward(runner, decode_batch()), "logits")
            ModelRunner.ping_tp(runner)
            ModelRunner.shutdown_tp(runner)
            self.assert_right_groups(rec, 3)
            self.assertEqual(rec.calls[-1][0], "destroy_process_group")

    def test_gather_rank_memory(self):
        from sglang.srt.model_executor.model_runner_kv_cache_mixin import ModelRunnerKVCacheMixin

        runner = SimpleNamespace(tp_rank=0, device="cuda", pre_load_rss_bytes=0, weight_bytes=1, own_activation_bytes=2,
                                 activation_peak_source=lambda: "measured", allocated_bytes=lambda: {"kv": 3},
                                 max_total_num_tokens=4, memory_plan=SimpleNamespace(total_bytes=5))
        with stand_ins("cuda") as rec:
            ranks = ModelRunnerKVCacheMixin.gather_rank_memory(runner)
            self.assertEqual([r["weight_bytes"] for r in ranks], [1, 1])
            self.assert_right_groups(rec, 1)

    def test_follower_loop(self):
        from sglang.srt.distributed.tp_worker import follower_loop

        r2t = torch.zeros(2, 8, dtype=torch.int32)
        ran = []
        runner = SimpleNamespace(tp_rank=1, req_to_token_pool=pool(r2t), forward_local=ran.append)
        script = [(PING, None), (FORWARD, pack_forward_batch(decode_batch(), r2t)), stop_message()]
        with stand_ins("cuda", rank=1, script=script) as rec:
            follower_loop(runner)
            self.assert_right_groups(rec, 3)
        self.assertEqual(len(ran), 1)
        self.assertEqual(r2t[1, 4].item(), 10)  # the decode slot the follower wrote from the broadcast


def distributed_calls(path: Path) -> list:
    """(line, name) of every torch.distributed collective a module calls, however torch.distributed is named."""
    tree = ast.parse(path.read_text())
    aliases, direct = {"torch.distributed"}, {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases.update(a.asname for a in node.names if a.name == "torch.distributed" and a.asname)
        elif isinstance(node, ast.ImportFrom) and node.module == "torch":
            aliases.update(a.asname or a.name for a in node.names if a.name == "distributed")
        elif isinstance(node, ast.ImportFrom) and node.module == "torch.distributed":
            direct.update({a.asname or a.name: a.name for a in node.names if a.name in COLLECTIVES})
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr in COLLECTIVES and ast.unparse(f.value) in aliases:
            out.append((node.lineno, f.attr))
        elif isinstance(f, ast.Name) and f.id in direct:
            out.append((node.lineno, direct[f.id]))
    return out


class TestEveryCollectiveIsCovered(unittest.TestCase):
    def test_collectives_only_in_communication_op(self):
        root = Path(sglang.__file__).parent
        allowed = Path(C.__file__).resolve()
        stray = {str(p.relative_to(root)): calls for p in sorted(root.rglob("*.py"))
                 if p.resolve() != allowed and (calls := distributed_calls(p))}
        self.assertEqual(stray, {}, "call collectives through distributed/communication_op.py (covered here)")
        self.assertTrue(distributed_calls(allowed))

    def test_every_helper_is_tested(self):
        helpers = {n for n in vars(C) if n.startswith("tp_") and callable(getattr(C, n))}
        tested = {"tp_all_reduce", "tp_all_gather", "tp_broadcast_object", "tp_all_gather_object", "tp_max_int",
                  "tp_min_int"}
        self.assertEqual(helpers - tested, set(), "a new collective helper needs a case in this file")


if __name__ == "__main__":
    unittest.main()

"""CPU threads of the scheduler processes (srt/utils/cpu_threads.py): counts from the affinity mask and the cgroup
quota (fake cgroup trees, cgroup v1 and v2), the cores kept for the HTTP process, upstream's binding variable, and
through a real server: /server_info, the scheduler's environment (OpenMP passive wait) and its threads' affinity.
"""

import os
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import psutil
import requests

from sglang.srt.utils import cpu_threads
from sglang.srt.utils.cpu_threads import (
    BIND_ENV,
    cgroup_cpu_limit,
    default_threads_per_process,
    parse_core_list,
    plan_cpu_threads,
)
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import openai_client, popen_launch_server

register_cpu_ci(est_time=25, suite="cpu")


def fake_cgroup(files: dict, proc_cgroup: str) -> tuple:
    root = Path(tempfile.mkdtemp())
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "proc_cgroup").write_text(proc_cgroup)
    return root, root / "proc_cgroup"


class TestCpuThreadPlan(unittest.TestCase):
    def test_cgroup_v2_quota(self):
        root, proc = fake_cgroup({"kubepods/pod1/cpu.max": "150000 100000\n"}, "0::/kubepods/pod1\n")
        self.assertEqual(cgroup_cpu_limit(root, proc), 1.5)
        root, proc = fake_cgroup({"kubepods/pod1/cpu.max": "max 100000\n"}, "0::/kubepods/pod1\n")
        self.assertIsNone(cgroup_cpu_limit(root, proc))

    def test_cgroup_v1_quota(self):
        files = {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "300000\n", "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n"}
        root, proc = fake_cgroup(files, "4:cpu,cpuacct:/docker/abc\n1:memory:/docker/abc\n")
        self.assertEqual(cgroup_cpu_limit(root, proc), 3.0)
        files["cpu,cpuacct/docker/abc/cpu.cfs_quota_us"] = "-1\n"
        root, proc = fake_cgroup(files, "4:cpu,cpuacct:/docker/abc\n")
        self.assertIsNone(cgroup_cpu_limit(root, proc))

    def test_quota_caps_the_affinity_mask(self):
        with mock.patch.object(os, "sched_getaffinity", return_value=set(range(16))), \
                mock.patch.object(cpu_threads, "cgroup_cpu_limit", return_value=2.5):
            self.assertEqual(cpu_threads.available_cpus(), (3, "cgroup CPU quota (2.5 CPUs)"))
            self.assertEqual(default_threads_per_process(), 2)  # 3 usable, one kept for the HTTP process

    def test_default_counts(self):
        # (cores, sharers) -> threads each: all cores up to two; above, one core left to the HTTP process
        for cores, sharers, want in ((1, 1, 1), (2, 1, 2), (2, 2, 1), (3, 1, 2), (8, 1, 7), (8, 2, 3), (4, 8, 1)):
            with mock.patch.object(cpu_threads, "available_cpus", return_value=(cores, "test")):
                self.assertEqual(default_threads_per_process(sharers), want, (cores, sharers))

    def test_flag_and_binding(self):
        self.assertEqual(parse_core_list("0-3,8"), [0, 1, 2, 3, 8])
        with self.assertRaisesRegex(ValueError, BIND_ENV):
            parse_core_list("0-x")
        plan = plan_cpu_threads(None, sharers=2, local_rank=1, bind="0-1|2-4")
        self.assertEqual((plan.num_threads, plan.bound_cores, plan.chosen_by), (3, [2, 3, 4], BIND_ENV))
        plan = plan_cpu_threads(5, sharers=2, local_rank=1, bind="0-1|2-4")
        self.assertEqual((plan.num_threads, plan.chosen_by), (5, "--num-threads"))
        with self.assertRaisesRegex(ValueError, "one list per TP rank"):
            plan_cpu_threads(None, sharers=2, local_rank=0, bind="0-1")

    def test_child_env_respects_the_user(self):
        with mock.patch.dict(os.environ, {}, clear=False):
            os.environ.pop("OMP_WAIT_POLICY", None)
            self.assertEqual(cpu_threads.scheduler_child_env(), {"OMP_WAIT_POLICY": "PASSIVE"})
            os.environ["OMP_WAIT_POLICY"] = "ACTIVE"
            self.assertEqual(cpu_threads.scheduler_child_env(), {})


class TestServerThreads(unittest.TestCase):
    """A real server pinned to core 0 with upstream's variable: one thread, every thread of the scheduler process on
    core 0, OpenMP told to wait passively."""

    @classmethod
    def setUpClass(cls):
        env = {BIND_ENV: "0"}
        env.pop("OMP_WAIT_POLICY", None)
        cls.server = popen_launch_server(other_args=["--max-total-tokens", "4096"], env=env)

    @classmethod
    def tearDownClass(cls):
        cls.server.kill()

    def scheduler_process(self) -> psutil.Process:
        for pid in self.server.child_pids():
            p = psutil.Process(pid)
            if "sglang.srt.launch.child" in " ".join(p.cmdline()) and "scheduler" in " ".join(p.cmdline()):
                return p
        self.fail("no scheduler process among the server's children")

    def test_plan_reported_and_applied(self):
        client = openai_client(self.server.base_url)
        reply = client.chat.completions.create(model="default", messages=[{"role": "user", "content": "Hi"}],
                                               max_tokens=8)
        self.assertTrue(reply.choices[0].message.content)
        info = requests.get(f"{self.server.base_url}/server_info", timeout=10).json()
        threads = info["cpu_threads"]
        self.assertEqual((threads["num_threads"], threads["bound_cores"], threads["chosen_by"]), (1, [0], BIND_ENV))
        self.assertEqual(threads["omp_wait_policy"], "PASSIVE")
        proc = self.scheduler_process()
        self.assertEqual(proc.environ().get("OMP_WAIT_POLICY"), "PASSIVE")
        # every thread of the scheduler process (kernel pool, OpenMP team, ZMQ, watchdog) runs on core 0 only
        for thread in proc.threads():
            status = Path(f"/proc/{proc.pid}/task/{thread.id}/status").read_text()
            allowed = next(line.split(":", 1)[1].strip() for line in status.splitlines()
                           if line.startswith("Cpus_allowed_list"))
            self.assertEqual(allowed, "0", f"thread {thread.id} of the scheduler process")

if __name__ == "__main__":
    unittest.main()

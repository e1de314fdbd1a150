"""The CPU kernels' thread pool (sgl-kernel/csrc/cpu/parallel.h): same bits with any thread count, idle threads
that sleep instead of spinning, and a pool sized by the runtime rather than by OpenMP.

The pool exists so that a region never waits for a thread another process has descheduled; that property is a speed
property (benchmark/README.md, busy-neighbour rows), not asserted by a timed test. What is asserted here is what it
must not break: results, and the CPU it leaves to others when idle.
"""

import time
import unittest

import numpy as np
import torch

from sglang.jit_kernel import cpu_ops
from sglang.jit_kernel.cpu_ops import cpu_kernels_expected, cpu_ops_status, get_cpu_ops
from sglang.srt.layers.quantization import packing
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=12, suite="cpu", serial=True)  # asserts a time or CPU measure: run alone

BF16 = torch.bfloat16


def process_cpu_s() -> float:
    return time.process_time()  # every thread of this process, user + system


@unittest.skipUnless(cpu_kernels_expected(), "no AVX-512 BF16 on this CPU, or SGLANG_CPU_KERNELS=0")
class TestKernelThreadPool(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ops = get_cpu_ops()

    def setUp(self):
        self.assertIsNotNone(self.ops, f"CPU kernels did not load: {cpu_ops_status()}")
        self.threads, self.spin_us = self.ops.get_num_threads(), self.ops.get_spin_us()
        torch.manual_seed(0)

    def tearDown(self):
        self.ops.set_num_threads(self.threads)
        self.ops.set_spin_us(self.spin_us)

    def run_kernels(self):
        """A few kernels whose regions split rows and weight tiles, on the same inputs at every call."""
        torch.manual_seed(0)
        w = torch.randn(1008, 256, dtype=BF16)
        x = torch.randn(37, 256, dtype=BF16)
        packed = self.ops.pack_linear_weight(w)
        out_packed = self.ops.packed_linear(x, packed)
        staging = packing.staging_q8_blocks(torch.from_numpy(
            (np.random.default_rng(1).standard_normal((208, 256)) * 0.05).astype(np.float32)))
        qpacked = packing.pack(staging, 8)
        out_quant = self.ops.quant_linear(x, qpacked, 208, 8)
        g = torch.randn(256, dtype=BF16)
        big = torch.randn(3000, 256, dtype=BF16)
        out_norm, _ = self.ops.rmsnorm(big, None, g, 1e-6)
        # 300 rows: at level amx the dense bf16-tile path (quant_gemm_amx_dense.h), its regions split weight tile pairs
        out_quant_rows = self.ops.quant_linear(big[:300], qpacked, 208, 8)
        return out_packed, out_quant, out_norm, out_quant_rows

    def test_same_bits_with_any_thread_count(self):
        """Chunks are taken dynamically, so which thread computes which rows changes from run to run; every row must
        still be computed exactly once, whatever the count (8 threads on this 2-core machine: oversubscribed, most of
        them not running when their region starts)."""
        self.ops.set_num_threads(1)
        ref = self.run_kernels()
        for n in (2, 3, 8):
            self.ops.set_num_threads(n)
            self.assertEqual(self.ops.get_num_threads(), n)
            for _ in range(3):
                for got, want in zip(self.run_kernels(), ref):
                    self.assertTrue(torch.equal(got, want), f"{n} threads")

    def test_every_index_once_under_churn(self):
        """Regions back to back with more threads than cores (workers descheduled mid-claim): each index runs exactly
        once per region. A chunk run twice was the failure behind a crash under load (a stale claim taking a chunk of
        the next job while its fields were written: parallel.h's closed epoch); a race this narrow rarely shows in a
        short run, but any miscounted or lost chunk does."""
        for threads, spin_us in ((2, 2000), (4, 0), (8, 20)):
            self.ops.set_num_threads(threads)
            self.ops.set_spin_us(spin_us)
            self.assertEqual(self.ops.pool_stress(20000, 64, 1), 0, (threads, spin_us))
            self.assertEqual(self.ops.pool_stress(2000, 1000, 7), 0, (threads, spin_us))

    def test_idle_threads_sleep(self):
        """After a region the workers spin for a few microseconds, then sleep: an idle server leaves its cores to
        other processes. With a spin of 1 s (what an OpenMP team does by default) the same idle wait burns CPU,
        which shows that the measurement would catch a spinning pool."""
        self.ops.set_num_threads(3)
        self.run_kernels()
        t0 = process_cpu_s()
        time.sleep(0.4)
        idle = process_cpu_s() - t0
        self.ops.set_spin_us(1_000_000)
        self.run_kernels()
        t0 = process_cpu_s()
        time.sleep(0.4)
        spinning = process_cpu_s() - t0
        self.assertLess(idle, 0.05, "idle kernel threads used CPU")
        self.assertGreater(spinning, 0.25, "a 1 s spin should have used CPU while idle (the measurement is blind)")

    def test_pool_follows_the_runtime_choice(self):
        cpu_ops.set_kernel_threads(3, 20)
        self.assertEqual((self.ops.get_num_threads(), self.ops.get_spin_us()), (3, 20))


if __name__ == "__main__":
    unittest.main()

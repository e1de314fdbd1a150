"""measure.py on CPU; encoder admission; mem_plan stays torch-free. (Backend declarations: layers/test_backend_declarations.py)"""

import mmap
import subprocess
import sys
import threading
import unittest

from sglang.srt.mem_plan.encoder import EncoderBudget, EncoderSpec, encoder_reservation_bytes
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=6, suite="cpu")

MiB = 2**20


class TestImportsStayLight(unittest.TestCase):
    def test_mem_plan_and_cli_do_not_import_torch(self):
        code = ("import sys, sglang.srt.mem_plan, sglang.srt.mem_plan.measure, sglang.srt.mem_plan.model_shapes, "
                "sglang.cli.plan; assert 'torch' not in sys.modules, 'torch imported'; print('ok')")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        self.assertEqual(out.stdout.strip(), "ok", out.stderr)


class TestMeasureCpu(unittest.TestCase):
    def test_peak_rss_reset_and_read(self):
        from sglang.srt.mem_plan import measure

        if not measure.peak_rss_supported():
            self.skipTest("no /proc/self/clear_refs")
        self.assertGreater(measure.cpu_current_rss_bytes(), 0)
        self.assertGreater(measure.cpu_available_bytes(), 0)
        # fresh anonymous pages, written one by one: a malloc'd block may be served from heap memory that is
        # already resident (seen in a fresh-clone CI run after the engine tests: 0 bytes of growth)
        with measure.measure_peak("cpu") as m:
            block = mmap.mmap(-1, 64 * MiB)
            for offset in range(0, 64 * MiB, mmap.PAGESIZE):
                block[offset] = 1
            block.close()
        self.assertGreaterEqual(m.increase_bytes, 48 * MiB)
        self.assertLess(m.increase_bytes, 256 * MiB)
        self.assertTrue(measure.reset_cpu_peak_rss())
        self.assertLess(measure.cpu_peak_rss_bytes() - measure.cpu_current_rss_bytes(), 32 * MiB)
        self.assertEqual(measure.min_across_ranks(123), 123)  # torch.distributed not initialised
        self.assertLessEqual(measure.pre_load_free_bytes("cpu", cap_bytes=1 << 30), 1 << 30)


class TestEncoder(unittest.TestCase):
    SPEC = EncoderSpec("vision", 27, 1152, 4304, 16, 729, output_dim=3584)

    def test_reservation(self):
        per_input = 729 * (6 * 1152 + 2 * 4304 + 3584) * 2 + 2 * 16 * 729 * 729 * 2
        self.assertEqual(self.SPEC.peak_bytes_per_input, per_input)
        self.assertEqual(encoder_reservation_bytes(self.SPEC, 4), 4 * per_input)
        self.assertEqual(encoder_reservation_bytes(self.SPEC, 4, encoder_mem_reserve_gib=1.5), int(1.5 * 2**30))
        self.assertEqual(encoder_reservation_bytes(None), 0)

    def test_admission_never_exceeds_reservation(self):
        budget = EncoderBudget(encoder_reservation_bytes(self.SPEC, 2), self.SPEC)
        cost = budget.cost_bytes(729)
        self.assertTrue(budget.try_acquire(cost))
        self.assertTrue(budget.try_acquire(cost))
        self.assertFalse(budget.try_acquire(cost))  # a third full-size image waits
        self.assertFalse(budget.try_acquire(budget.cost_bytes(10)))  # full: even a tiny image waits
        budget.release(cost)
        self.assertTrue(budget.try_acquire(budget.cost_bytes(100)))
        self.assertFalse(budget.fits_ever(3 * cost))
        with self.assertRaises(ValueError):
            budget.release(10 * cost)
        budget.check_integrity()

    def test_concurrent_admission(self):
        budget = EncoderBudget(10_000)
        peak = [0]
        lock = threading.Lock()

        def worker():
            for _ in range(200):
                if budget.try_acquire(700):
                    with lock:
                        peak[0] = max(peak[0], budget.in_use_bytes)
                    budget.release(700)

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertLessEqual(peak[0], 10_000)
        self.assertEqual(budget.in_use_bytes, 0)
        budget.check_integrity()


if __name__ == "__main__":
    unittest.main()

"""The page ids of a batch go straight into the backend's planned kv_indices buffer (paged_kv_indices.py): the
Triton kernel (under the CPU interpreter, in a child process) and the per-request copy used where Triton does not
run both equal page ids computed from plain lists, leave the rest of the buffer alone, and a batch larger than the
planned buffer is refused instead of written past its end."""

import unittest

import torch
from interpreted_run import run_in_interpreter
from page_id_cases import CASES, run_case

from sglang.srt.layers.attention.paged_kv_indices import _cumsum0, fill_page_ids
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=15, suite="cpu")


class TestPageIds(unittest.TestCase):
    def test_triton_kernel_interpreted(self):
        results = run_in_interpreter("page_ids")
        self.assertEqual(len(results), len(CASES))
        for key, (got, expected, tail) in results.items():
            with self.subTest(case=CASES[int(key)]):
                self.assertEqual(got, expected)
                self.assertEqual(set(tail), {-7})  # nothing written past the batch's pages

    def test_copy_path(self):
        for case in CASES:
            for rows_cpu in (True, False):
                with self.subTest(case=case, rows_cpu=rows_cpu):
                    got, expected, tail = run_case(*case, rows_cpu=rows_cpu)
                    self.assertEqual(got, expected)
                    self.assertEqual(set(tail), {-7})

    def test_batch_beyond_the_planned_buffer_is_refused(self):
        r2t = torch.zeros(2, 64, dtype=torch.int64)
        indptr = torch.tensor(_cumsum0([40]), dtype=torch.int32)
        with self.assertRaisesRegex(ValueError, "exceeds the planned kv_indices buffer"):
            fill_page_ids(r2t, torch.tensor([1]), [1], [40], indptr, 1, torch.empty(39, dtype=torch.int32))


if __name__ == "__main__":
    unittest.main()

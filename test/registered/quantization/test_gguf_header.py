"""gguf_header.read_tensor_table (the start's short header walk) against the gguf package's GGUFReader: the bundled
file and a written file with every metadata value type (strings, nested arrays, 64-bit values)."""

import os
import tempfile
import unittest

import numpy as np

from sglang.srt.mem_plan.gguf_header import read_tensor_table
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="cpu")


def reference(path):
    import gguf

    return [(t.name, int(t.tensor_type), len(t.shape)) for t in gguf.GGUFReader(path).tensors]


class TestGgufHeader(unittest.TestCase):
    def test_bundled_file(self):
        from sglang.srt.model_loader.model_path import gguf_source_path
        from sglang.srt.server_args import ServerArgs

        path = gguf_source_path(ServerArgs())
        table = read_tensor_table(path)
        self.assertEqual(len(table), 272)
        self.assertEqual(table, reference(path))

    def test_every_value_type(self):
        import gguf

        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.gguf")
            w = gguf.GGUFWriter(path, "llama")
            w.add_uint8("a.u8", 7), w.add_int16("a.i16", -3), w.add_uint64("a.u64", 2**40), w.add_float64("a.f64", 0.5)
            w.add_bool("a.b", True), w.add_string("a.s", "héllo"), w.add_array("a.strs", ["x", "yy", ""])
            w.add_array("a.ints", [1, 2, 3]), w.add_array("a.floats", [0.5, 1.5])
            w.add_tensor("blk.0.attn_q.weight", np.zeros((4, 32), dtype=np.float32))
            w.add_tensor("token_embd.weight", np.zeros((8, 32), dtype=np.float16))
            w.add_tensor("blk.0.ffn_gate_exps.weight", np.zeros((2, 4, 32), dtype=np.float32))
            w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
            table = read_tensor_table(path)
            self.assertEqual(table, reference(path))
            self.assertEqual([(n, d) for n, _, d in table],
                             [("blk.0.attn_q.weight", 2), ("token_embd.weight", 2), ("blk.0.ffn_gate_exps.weight", 3)])
            self.assertEqual(table[1][1], int(gguf.GGMLQuantizationType.F16))
            with open(path, "r+b") as f:  # a version this reader does not take (as a big-endian file reads)
                f.seek(4), f.write((3 << 24).to_bytes(4, "little"))
            with self.assertRaises(ValueError):
                read_tensor_table(path)


if __name__ == "__main__":
    unittest.main()

"""gguf_header (the start's header walk: the tensor table, the metadata values, the tensors' offsets) and
gguf_file.open_gguf (the mapped tensor data) against the gguf package's GGUFReader: the bundled file and a written file
with every metadata value type (strings, nested arrays, 64-bit values) and a stacked expert tensor."""

import os
import tempfile
import unittest

import numpy as np

from sglang.srt.mem_plan.gguf_header import read_gguf_header, read_tensor_table
from sglang.srt.model_loader.gguf_file import open_gguf
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="cpu")


def reference(path):
    import gguf

    return [(t.name, int(t.tensor_type), len(t.shape)) for t in gguf.GGUFReader(path).tensors]


def assert_same_as_reader(test, path):
    """Every metadata value, tensor offset and tensor's bytes equal GGUFReader's."""
    import gguf

    reader = gguf.GGUFReader(path)
    header, mapped = read_gguf_header(path), open_gguf(path)
    want = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    test.assertEqual(header.fields, want)
    test.assertEqual(mapped.fields, want)
    test.assertEqual([(t.name, t.offset) for t in header.tensors], [(t.name, t.data_offset) for t in reader.tensors])
    for ours, ref in zip(mapped.tensors, reader.tensors):
        test.assertEqual((ours.name, ours.tensor_type, ours.shape), (ref.name, ref.tensor_type, tuple(map(int, ref.shape))))
        got = gguf.quants.dequantize(ours.data, ours.tensor_type)
        exp = gguf.quants.dequantize(ref.data, ref.tensor_type)
        test.assertEqual(got.shape, exp.shape, ours.name)
        np.testing.assert_array_equal(got, exp, err_msg=ours.name)
    test.assertEqual(len(mapped.tensors), len(reader.tensors))


class TestGgufHeader(unittest.TestCase):
    def test_bundled_file(self):
        from sglang.srt.model_loader.model_path import gguf_source_path
        from sglang.srt.server_args import ServerArgs

        path = gguf_source_path(ServerArgs())
        table = read_tensor_table(path)
        self.assertEqual(len(table), 272)
        self.assertEqual(table, reference(path))
        assert_same_as_reader(self, path)

    def test_every_value_type(self):
        import gguf

        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.gguf")
            w = gguf.GGUFWriter(path, "llama")
            w.add_custom_alignment(64)  # not the default 32: the data section starts at a 64-byte boundary
            w.add_uint8("a.u8", 7), w.add_int16("a.i16", -3), w.add_uint64("a.u64", 2**40), w.add_float64("a.f64", 0.5)
            w.add_bool("a.b", True), w.add_string("a.s", "héllo"), w.add_array("a.strs", ["x", "yy", ""])
            w.add_array("a.ints", [1, 2, 3]), w.add_array("a.floats", [0.5, 1.5])
            rng = np.random.default_rng(0)
            w.add_tensor("blk.0.attn_q.weight", rng.standard_normal((4, 32)).astype(np.float32))
            w.add_tensor("token_embd.weight", rng.standard_normal((8, 32)).astype(np.float16))
            w.add_tensor("blk.0.ffn_gate_exps.weight", rng.standard_normal((2, 4, 32)).astype(np.float32))
            w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
            table = read_tensor_table(path)
            self.assertEqual(table, reference(path))
            self.assertEqual([(n, d) for n, _, d in table],
                             [("blk.0.attn_q.weight", 2), ("token_embd.weight", 2), ("blk.0.ffn_gate_exps.weight", 3)])
            self.assertEqual(table[1][1], int(gguf.GGMLQuantizationType.F16))
            assert_same_as_reader(self, path)
            with open(path, "r+b") as f:  # a version this reader does not take (as a big-endian file reads)
                f.seek(4), f.write((3 << 24).to_bytes(4, "little"))
            with self.assertRaises(ValueError):
                read_tensor_table(path)

    def test_custom_alignment(self):
        """general.alignment 64: the header's end rounded up to 64, not the default 32 (header lengths vary, so some
        of these files have a data section 32 bytes further on than the default would put it)."""
        import gguf

        with tempfile.TemporaryDirectory() as d:
            for pad in range(0, 64, 8):
                path = os.path.join(d, f"a{pad}.gguf")
                w = gguf.GGUFWriter(path, "llama")
                w.add_custom_alignment(64)
                w.add_string("a.pad", "x" * pad)
                w.add_tensor("blk.0.attn_q.weight", np.arange(128, dtype=np.float32).reshape(4, 32))
                w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
                assert_same_as_reader(self, path)
                self.assertEqual(read_gguf_header(path).tensors[0].offset % 64, 0)


if __name__ == "__main__":
    unittest.main()

"""The ISA resolver (jit_kernel/cpu_isa.py) on the flag sets of real CPUs, SGLANG_CPU_ISA, and what follows from the
level: --dtype auto, the served weight format, a refused --quantization. Flag lists are trimmed /proc/cpuinfo lines."""

import os
import subprocess
import sys
import unittest
from types import SimpleNamespace

from sglang.jit_kernel import cpu_isa
from sglang.jit_kernel.cpu_isa import native_level, read_cpu_flags, resolve_level
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=15, suite="cpu")

BASE = "fpu sse sse2 ssse3 sse4_1 sse4_2 popcnt avx"
HASWELL = f"{BASE} avx2 fma f16c bmi1 bmi2"
ZEN3 = f"{HASWELL} sha_ni vaes vpclmulqdq"
ICE_LAKE = f"{HASWELL} avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni avx512_vbmi avx512_vbmi2 avx512ifma"
ZEN4 = f"{ICE_LAKE} avx512_bf16 avx512_bitalg avx512_vpopcntdq"
SAPPHIRE_RAPIDS = f"{ZEN4} avx512_fp16 amx_bf16 amx_tile amx_int8 avx_vnni"


def flags(line: str) -> frozenset:
    return frozenset(line.split())


class TestNativeLevel(unittest.TestCase):
    def test_real_cpus(self):
        self.assertEqual(native_level(flags(BASE)), "scalar")
        self.assertEqual(native_level(flags(HASWELL)), "avx2")
        self.assertEqual(native_level(flags(ZEN3)), "avx2")
        self.assertEqual(native_level(flags(ICE_LAKE)), "avx512_vnni")
        self.assertEqual(native_level(flags(ZEN4)), "avx512_bf16")
        self.assertEqual(native_level(flags(SAPPHIRE_RAPIDS)), "amx")

    def test_a_level_needs_every_level_below(self):
        # AVX-512 hidden by the OS (or a VM) while AMX flags remain: the level stops at the first gap
        self.assertEqual(native_level(flags(SAPPHIRE_RAPIDS.replace(" avx512_vnni", ""))), "avx2")
        self.assertEqual(native_level(flags(HASWELL.replace(" f16c", ""))), "scalar")
        self.assertEqual(native_level(flags(ZEN4.replace(" avx512dq", ""))), "avx2")

    def test_cpuinfo_file(self):
        import tempfile

        with tempfile.NamedTemporaryFile("w", suffix="cpuinfo", delete=False) as f:
            f.write(f"processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: {ICE_LAKE}\n\nprocessor\t: 1\n")
        try:
            self.assertEqual(native_level(read_cpu_flags(f.name)), "avx512_vnni")
        finally:
            os.unlink(f.name)
        self.assertEqual(read_cpu_flags("/nonexistent/cpuinfo"), frozenset())


class TestForcedLevel(unittest.TestCase):
    def test_lower_levels_are_allowed(self):
        for level in ("auto", None, "", "amx"):
            self.assertEqual(resolve_level(level, flags(SAPPHIRE_RAPIDS)), "amx")
        for level in ("avx512_bf16", "avx512_vnni", "avx2", "scalar", " AVX2 "):
            self.assertEqual(resolve_level(level, flags(SAPPHIRE_RAPIDS)), level.strip().lower())

    def test_a_higher_level_is_refused_naming_the_missing_flags(self):
        with self.assertRaises(ValueError) as e:
            resolve_level("avx512_bf16", flags(ICE_LAKE))
        self.assertIn("SGLANG_CPU_ISA=avx512_bf16: this CPU's level is avx512_vnni (it lacks avx512_bf16)", str(e.exception))
        with self.assertRaises(ValueError) as e:
            resolve_level("avx512_vnni", flags(ZEN3))
        self.assertIn("lacks avx512f, avx512bw, avx512vl, avx512dq, avx512_vnni", str(e.exception))
        with self.assertRaises(ValueError) as e:
            resolve_level("avx3", flags(ZEN3))
        self.assertIn("choose one of scalar, avx2, avx512_vnni, avx512_bf16, amx", str(e.exception))

    def test_env_in_a_process(self):
        """SGLANG_CPU_ISA is read once per process; the dtype rule and the summary follow it."""
        code = ("from sglang.jit_kernel.cpu_isa import cpu_isa, cpu_isa_summary; "
                "from sglang.srt.mem_plan.dtypes import resolve_model_dtype; "
                "print(cpu_isa(), resolve_model_dtype('auto', 'cpu', 'bfloat16'), "
                "resolve_model_dtype('auto', 'cuda', 'float16'), '|', cpu_isa_summary())")
        for level, dtype in (("scalar", "float32"), ("avx2", "float32")):
            out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, SGLANG_CPU_ISA=level),
                                 capture_output=True, text=True, timeout=120)
            self.assertEqual(out.returncode, 0, out.stderr[-2000:])
            self.assertEqual(out.stdout.split("|")[0].split(), [level, dtype, "float16"])
            self.assertIn(f"{level} (forced by SGLANG_CPU_ISA; native {cpu_isa.native_cpu_isa()})", out.stdout)


class TestQuantizationFollowsTheLevel(unittest.TestCase):
    def setUp(self):
        cpu_isa.cpu_isa.cache_clear()
        self.addCleanup(cpu_isa.cpu_isa.cache_clear)
        self.env = dict(os.environ)
        self.addCleanup(lambda: (os.environ.clear(), os.environ.update(self.env)))

    def served(self, quantization, dtype_flag, resolved_dtype, gguf="m.gguf", kernels=True):
        from sglang.srt.configs.resolved import served_quantization

        sa = SimpleNamespace(quantization=quantization, dtype=dtype_flag, tp_size=1)
        return served_quantization(sa, gguf, "cpu", resolved_dtype, kernels=lambda: kernels)

    def test_auto_float32_keeps_the_blocks_explicit_float32_is_the_reference(self):
        os.environ["SGLANG_CPU_ISA"] = "avx2"
        self.assertEqual(self.served(None, "auto", "float32"), "gguf")
        self.assertEqual(self.served(None, "float32", "float32"), "none")
        self.assertEqual(self.served(None, "auto", "float32", kernels=False), "none")

    @unittest.skipIf(cpu_isa.native_cpu_isa() == "scalar", "the level is scalar anyway")
    def test_no_quantized_gemm_below_avx2_refuses_quantization(self):
        os.environ["SGLANG_CPU_ISA"] = "scalar"
        for q in ("w8a8_int8", "gguf"):
            with self.assertRaises(ValueError) as e:
                self.served(q, "auto", "float32")
            self.assertIn(f"--quantization {q}: this CPU's level is scalar", str(e.exception))
            self.assertIn("needs avx2", str(e.exception))
        self.assertEqual(self.served(None, "auto", "float32", kernels=False), "none")  # unset: dequantized at load
        os.environ["SGLANG_CPU_ISA"] = "avx2"
        cpu_isa.cpu_isa.cache_clear()
        self.assertEqual(self.served("w8a8_int8", "auto", "float32", gguf=None), "w8a8_int8")


if __name__ == "__main__":
    unittest.main()

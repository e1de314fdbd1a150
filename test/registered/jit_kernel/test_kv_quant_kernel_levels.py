"""The quantized-KV CPU kernels (extend_attention_quant, kv_quant_write: sgl-kernel/csrc/cpu/decode_attention_quant.h,
quant_attention_op.h, quant_kv_write.h, kv_quant_int2.h) run from level avx512_vnni: AVX-512 F/BW/VL/DQ, no BF16
instruction (the Intel CPUs with AVX-512 VNNI but no BF16 read their quantized pools in place instead of through the
torch gather path). Two checks:
  - the compiled module: no function the quantized-KV entry points reach (their own, their lambdas and OpenMP bodies,
    and every function those call directly) holds a BF16 instruction (VCVTNEPS2BF16, VCVTNE2PS2BF16, VDPBF16PS) --
    a CPU without BF16 would fault on one. The scan itself is checked on the bf16 decode kernel, where it must find
    them;
  - below the native level (SGLANG_CPU_ISA=avx512_vnni, in a subprocess): the kernel tests against their fp64
    reference (test_cpu_quant_attention.py, test_cpu_quant_int2.py, test_cpu_quant_ring.py) and the engine test, kernel and torch gather
    path teacher-forced against the bf16-KV model with every format (test_kv_quant_kernel_engine.py: fp32 activations
    there), all run, none skipped.
"""

import os
import re
import shutil
import subprocess
import sys
import unittest
from pathlib import Path

from sglang.jit_kernel.cpu_isa import KV_QUANT_LEVEL, cpu_isa, level_rank
from sglang.jit_kernel.cpu_ops import get_kv_quant_ops, kv_quant_kernels_expected
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=35, suite="cpu")

BF16_INSTRUCTIONS = re.compile(r"\tv(cvtneps2bf16|cvtne2ps2bf16|dpbf16ps)\b")
QUANT_KV_ROOTS = ("extend_attention_quant", "kv_quant_write", "write_ring_rows", "quant_attention_")
# before the tests load anything: the level the module dispatches at, and whether the bf16 kernels load there
PROBE_THEN_TESTS = """import sys, unittest
from sglang.jit_kernel.cpu_ops import get_cpu_ops, get_kv_quant_ops
print("LEVEL", get_kv_quant_ops().get_cpu_isa(), get_cpu_ops() is None, flush=True)
unittest.main(module=None, argv=["unittest", "-v", *sys.argv[1:]])
"""
REGISTERED = Path(__file__).resolve().parents[1]
AT_LEVEL = [REGISTERED / "jit_kernel" / "test_cpu_quant_attention.py",
            REGISTERED / "jit_kernel" / "test_cpu_quant_int2.py",
            REGISTERED / "jit_kernel" / "test_cpu_quant_ring.py",
            REGISTERED / "engine" / "test_kv_quant_kernel_engine.py"]


def functions(module_file: str) -> dict:
    """Each function of the shared object (demangled) -> (holds a BF16 instruction, the functions it calls directly)."""
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", module_file], capture_output=True, text=True,
                          check=True).stdout
    out, cur = {}, None
    for line in text.splitlines():
        head = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if head:
            cur = head.group(1)
            out[cur] = [False, set()]
        elif cur is not None:
            if BF16_INSTRUCTIONS.search(line):
                out[cur][0] = True
            call = re.search(r"\t(?:call|jmp)\s+[0-9a-f]+ <(.*?)(?:\+0x[0-9a-f]+)?>$", line)
            if call and call.group(1) != cur:  # a call through the PLT (inline functions of a -fPIC build) too
                out[cur][1].add(call.group(1).removesuffix("@plt"))
    return out


def reached(funcs: dict, roots) -> set:
    seen, stack = set(), [f for f in funcs if any(r in f for r in roots) and not f.endswith("@plt")]
    while stack:
        f = stack.pop()
        if f not in seen and f in funcs:
            seen.add(f)
            stack.extend(funcs[f][1])
    return seen


@unittest.skipUnless(kv_quant_kernels_expected(), "the quantized-KV CPU kernels do not run at this CPU level")
class TestKvQuantKernelLevels(unittest.TestCase):
    @unittest.skipUnless(shutil.which("objdump"), "objdump (binutils) is not installed")
    def test_no_bf16_instruction_is_reachable(self):
        ops = get_kv_quant_ops()
        self.assertIsNotNone(ops, "the quantized-KV kernels did not load")
        funcs = functions(ops.__file__)
        quant = reached(funcs, QUANT_KV_ROOTS)
        self.assertGreater(len([f for f in quant if "quant_attention_heads<" in f]), 10, "the scan found no kernel")
        self.assertEqual([f for f in quant if funcs[f][0]], [])
        bf16 = reached(funcs, ("decode_attention_heads<",))  # the bf16 decode kernel: VDPBF16PS / VCVTNEPS2BF16
        self.assertTrue(any(funcs[f][0] for f in bf16), "the scan finds no BF16 instruction where there are some")

    @unittest.skipUnless(level_rank(cpu_isa()) > level_rank(KV_QUANT_LEVEL), "this level is the lowest already")
    def test_kernel_and_engine_tests_at_avx512_vnni(self):
        env = dict(os.environ, SGLANG_CPU_ISA=KV_QUANT_LEVEL)
        # one interpreter for the level probe and the four files (each would pay the torch and sglang imports again):
        # the engine test's directory on the path beside the kernel tests' own
        dirs = [str(p.parent) for p in AT_LEVEL] + [x for x in env.get("PYTHONPATH", "").split(os.pathsep) if x]
        run_env = dict(env, PYTHONPATH=os.pathsep.join(dict.fromkeys(dirs)))
        proc = subprocess.run([sys.executable, "-c", PROBE_THEN_TESTS, *[p.stem for p in AT_LEVEL]],
                              cwd=AT_LEVEL[0].parent, env=run_env, capture_output=True, text=True, timeout=1800)
        # the module dispatches at that level, where the bf16 kernels do not load and the quantized-KV ones do
        self.assertEqual(proc.stdout.split()[:3], ["LEVEL", KV_QUANT_LEVEL, "True"], proc.stderr[-2000:])
        out = proc.stderr
        self.assertEqual(proc.returncode, 0, out[-3000:])
        self.assertRegex(out[-3000:], r"\nOK\n?", out[-3000:])
        self.assertNotIn("skipped", out, out[-3000:])
        for path in AT_LEVEL:
            with self.subTest(test=path.name):
                ran = re.findall(rf"^test\w+ \({path.stem}\.\w+\.test\w+\)", out, re.M)
                self.assertTrue(ran, f"no test of {path.name} ran:\n{out[-3000:]}")


if __name__ == "__main__":
    unittest.main()

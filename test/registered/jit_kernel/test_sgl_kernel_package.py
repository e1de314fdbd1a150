"""The sgl_kernel package (sgl-kernel/, built ahead of time by scripts/install.sh) and how the runtime picks a build.

- setup.py records the same source digest that the loader computes (a drift would make every start recompile);
- in CI, where install.sh built the package from this checkout, the runtime serves that build, not a first-use one;
- a package built from other sources is never used (an edited kernel must not be served stale);
- SGLANG_CPU_AMX=0 keeps the kernels and switches AMX off.
"""

import ast
import os
import subprocess
import sys
import unittest
from pathlib import Path
from unittest import mock

from sglang.jit_kernel import cpu_ops
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=15, suite="cpu")

SETUP_PY = Path(cpu_ops.CSRC_DIR).parents[1] / "setup.py"


def _setup_py_digest() -> str:
    """Runs setup.py's own source_digest (taken out of the file, without running setup())."""
    tree = ast.parse(SETUP_PY.read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "source_digest")
    namespace = {"Path": Path, "hashlib": __import__("hashlib")}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(SETUP_PY), "exec"), namespace)
    return namespace["source_digest"](Path(cpu_ops.CSRC_DIR))


class TestSglKernelPackage(unittest.TestCase):
    def test_setup_py_and_loader_agree_on_the_source_digest(self):
        self.assertTrue(Path(cpu_ops.CSRC_DIR, "bindings.cpp").is_file(), cpu_ops.CSRC_DIR)
        self.assertEqual(_setup_py_digest(), cpu_ops.source_digest())

    @unittest.skipUnless(cpu_ops.cpu_kernels_expected(), "the kernels are not used on this CPU")
    def test_ci_serves_the_ahead_of_time_build(self):
        try:
            import sgl_kernel
        except ImportError:
            if os.environ.get("CI"):
                self.fail("CI ran scripts/install.sh, which builds sgl_kernel, but it is not installed")
            self.skipTest("sgl_kernel is not installed here (pip install --no-build-isolation ./sgl-kernel)")
        _, digest = sgl_kernel.load()
        if digest != cpu_ops.source_digest():
            if os.environ.get("CI"):
                self.fail(f"sgl_kernel was built from other sources ({digest}) than this checkout's")
            self.skipTest("the kernel sources were edited after sgl_kernel was built")
        ops = cpu_ops.get_cpu_ops()
        self.assertIsNotNone(ops, cpu_ops.cpu_ops_status())
        self.assertTrue(ops.__name__.startswith("sgl_kernel"), ops.__name__)
        self.assertIn("(sgl_kernel package)", cpu_ops.cpu_kernels_summary())

    def test_a_build_from_other_sources_is_not_used(self):
        fake = mock.MagicMock()
        fake.load.return_value = (object(), "000000000000")
        with mock.patch.dict(sys.modules, {"sgl_kernel": fake}):
            self.assertIsNone(cpu_ops._prebuilt())
            fake.load.return_value = (fake, cpu_ops.source_digest())
            self.assertIs(cpu_ops._prebuilt(), fake)

    @unittest.skipUnless(cpu_ops.cpu_kernels_expected(), "the kernels are not used on this CPU")
    def test_amx_switch(self):
        code = "from sglang.jit_kernel import cpu_ops as c; print(c.amx_available(), '|', c.cpu_kernels_summary())"
        env = dict(os.environ, SGLANG_CPU_AMX="0")
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr[-2000:])
        self.assertEqual(out.stdout.strip().splitlines()[-1].split(" | ")[0], "False")
        self.assertIn("without AMX, switched off by SGLANG_CPU_AMX=0", out.stdout)


if __name__ == "__main__":
    unittest.main()

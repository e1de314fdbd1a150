"""Builds the `sgl_kernel` package: the CPU kernels in csrc/cpu/ compiled ahead of time into `sgl_kernel._cpu_ops`.

Install with the torch it will run against: `pip install --no-build-isolation ./sgl-kernel` (scripts/install.sh does).
The build records a digest of the sources; at run time `sglang.jit_kernel.cpu_ops` uses this build only while the
checkout's sources still have that digest, and otherwise compiles them on first use.
"""

import hashlib
from pathlib import Path

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

HERE = Path(__file__).resolve().parent
CSRC = HERE / "csrc" / "cpu"


def source_digest(csrc_dir: Path) -> str:
    """sha256 over the sorted file names and contents (the same rule as sglang.jit_kernel.cpu_ops.source_digest;
    test_sgl_kernel_package.py checks that both agree)."""
    h = hashlib.sha256()
    for path in sorted(csrc_dir.iterdir()):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


(HERE / "python" / "sgl_kernel" / "_build_info.py").write_text(
    f'"""Written by setup.py at build time."""\n\nSOURCE_DIGEST = "{source_digest(CSRC)}"\n'
)

setup(
    name="sgl-kernel",
    version="0.1.0+cpu",
    description="CPU kernels of the memory-planned SGLang fork (AVX-512 BF16, AMX where present)",
    package_dir={"": "python"},
    packages=["sgl_kernel"],
    ext_modules=[
        CppExtension(
            "sgl_kernel._cpu_ops",
            [str(CSRC / "bindings.cpp")],
            include_dirs=[str(CSRC)],
            extra_compile_args=["-O3", "-fopenmp"],
            extra_link_args=["-fopenmp"],
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)

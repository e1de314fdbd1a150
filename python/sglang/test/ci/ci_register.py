"""CI suite markers for files under test/registered/.

Each test file calls one or more of these at module level, e.g. `register_cpu_ci(est_time=30, suite="cpu")`.
They do nothing at runtime: test/run_suite.py finds them by parsing the file's AST, without importing it, so a
GPU-only test file never has to be importable on a CPU machine to be listed.
"""


def register_cpu_ci(est_time: float, suite: str = "cpu", nightly: bool = False, disabled: str | None = None,
                    serial: bool = False) -> None:
    """serial=True: run_suite runs the file alone, after the groups that run side by side (a test that measures
    time, CPU or latency, which a neighbour group on the same cores would distort)."""
    return None


def register_cuda_ci(est_time: float, suite: str = "stage-a-test-1-gpu", nightly: bool = False, disabled: str | None = None) -> None:
    return None


def register_amd_ci(est_time: float, suite: str = "stage-a-test-1-gpu-amd", nightly: bool = False, disabled: str | None = None) -> None:
    return None

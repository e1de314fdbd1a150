"""Every CPU ISA level this machine can run (jit_kernel/cpu_isa.py), forced with SGLANG_CPU_ISA: the default model as
a start serves it there, against the exact fp32 reference.

The reference is the bundled Q4_1 file dequantized to fp32 (`--dtype float32`: no kernel, no activation rounding);
its greedy runs of 8 chat prompts are computed once here. Each level then runs in its own process (the level is read
once per process) and reports:
  - what it resolved: --dtype auto (bf16 only from avx512_bf16), the weight format (the GGUF blocks wherever the
    quantized GEMM runs: avx2 and up; dequantized at load below), the kernels' summary;
  - teacher-forced top-1 agreement of that model with the reference runs: >= 0.90 where the blocks are served
    (int8 activations, and bf16 ones at avx512_bf16), exactly 1.0 at scalar (the reference path itself);
  - the greedy tokens of one prompt through sglang.Engine (the path users take) equal to the same process's model's
    greedy run: the engine serves at the level it reports; `sglang plan`'s attention workspace equals the start's.
Levels above the native one are skipped (and refused: test_cpu_isa.py).
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest
from concurrent.futures import ThreadPoolExecutor

from sglang.jit_kernel.cpu_isa import LEVELS, level_rank, native_cpu_isa
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=50, suite="cpu")

PROMPTS = ["Tell me a joke about cats.", "Why is the sky blue?", "What is 17 plus 25?", "Explain recursion to a child.",
           "Write a haiku about the ocean.", "Give me a name for a pet turtle.", "Summarize the water cycle.",
           "How do airplanes stay in the air?"]
NEW_TOKENS = 24
ENGINE_TOKENS = 12
LEVELS_AT_ONCE = 2


def _setup():
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader import resolve_model_path
    from sglang.srt.model_loader.model_path import gguf_source_path
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.utils.hf_transformers_utils import apply_chat_template, get_tokenizer

    args = ServerArgs()
    model_dir = resolve_model_path(args)
    tok = get_tokenizer(model_dir)
    prompts = [apply_chat_template(tok, [{"role": "user", "content": p}], tokenize=True) for p in PROMPTS]
    return args, model_dir, gguf_source_path(args), prompts, ModelConfig


def reference_runs():
    """Greedy runs of the fp32 dequantized reference (as `--dtype float32` serves the bundled file)."""
    from sglang.srt.model_loader import load_model
    from sglang.test.top1_agreement import greedy_runs

    args, model_dir, _, prompts, ModelConfig = _setup()
    config = ModelConfig.from_pretrained(model_dir, dtype="float32")
    return prompts, greedy_runs(load_model(config, "cpu"), config, prompts, NEW_TOKENS)


def worker(runs_path: str) -> dict:
    """In a process started with SGLANG_CPU_ISA: the model as a start resolves and loads it, measured."""
    import sglang
    from sglang.srt.configs.resolved import served_quantization, use_fp32_kernels
    from sglang.srt.model_loader import load_model
    from sglang.test.top1_agreement import greedy_runs, teacher_forced_agreement

    args, model_dir, gguf, prompts, ModelConfig = _setup()
    runs = json.load(open(runs_path))
    config = ModelConfig.from_server_args(args, model_dir)
    quant = served_quantization(args, gguf, "cpu", config.dtype_name)
    use_fp32_kernels(args.dtype, "cpu", config.dtype_name)  # as the runner does: the engine below decides the same
    model = load_model(config, "cpu", quant, gguf)
    out = {"dtype": config.dtype_name, "quantization": quant,
           "agreement": teacher_forced_agreement(model, config, prompts, runs),
           "own_run": greedy_runs(model, config, prompts[:1], ENGINE_TOKENS)[0]}
    del model
    from sglang.cli.plan import run as plan_run

    out["plan_attention_workspace"] = _term(plan_run(["--device", "cpu", "--json"])[1]["plan"], "attention_workspace")
    engine = sglang.Engine(log_level="error")
    try:
        res = engine.generate(input_ids=prompts[0], sampling_params={"temperature": 0, "max_new_tokens": ENGINE_TOKENS})
        info = engine.get_server_info()
    finally:
        engine.shutdown()
    out.update(engine_ids=res["output_ids"], attention_workspace=_term(info["memory_plan"], "attention_workspace"), cpu_isa=info["cpu_isa"], cpu_kernels=info["cpu_kernels"],
               server_dtype=info["dtype"], server_quantization=info["quantization"])
    return out


def _term(plan: dict, name: str) -> int:
    return next(t["num_bytes"] for t in plan["terms"] if t["name"] == name)


class TestCpuIsaLevels(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.prompts, cls.runs = reference_runs()
        cls.tmp = tempfile.TemporaryDirectory()
        cls.runs_path = os.path.join(cls.tmp.name, "runs.json")
        json.dump(cls.runs, open(cls.runs_path, "w"))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def run_level(self, level: str) -> subprocess.CompletedProcess:
        # OpenMP waits sleep instead of spinning (as the server sets for its schedulers): two workers share the cores
        env = dict(os.environ, SGLANG_CPU_ISA=level)
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        return subprocess.run([sys.executable, __file__, "--worker", self.runs_path], env=env, capture_output=True,
                              text=True, timeout=900)

    def test_each_level_down_from_native(self):
        native = native_cpu_isa()
        levels = list(reversed(LEVELS[: level_rank(native) + 1]))
        # LEVELS_AT_ONCE workers at a time: each is mostly single-threaded Python (imports, loading, an engine's
        # start), so they overlap on the cores; each level is still its own process, read once there
        with ThreadPoolExecutor(max_workers=LEVELS_AT_ONCE) as pool:
            done = dict(zip(levels, pool.map(self.run_level, levels)))
        for level in levels:
            with self.subTest(level=level):
                proc = done[level]
                self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
                r = json.loads(proc.stdout.strip().splitlines()[-1])
                print(f"{level}: dtype {r['dtype']}, weights {r['quantization']}, top-1 agreement with the fp32 "
                      f"reference {r['agreement']:.3f}; kernels: {r['cpu_kernels']}")
                bf16 = level_rank(level) >= level_rank("avx512_bf16")
                served = level_rank(level) >= level_rank("avx2")
                self.assertEqual(r["dtype"], "bfloat16" if bf16 else "float32")
                self.assertEqual(r["quantization"], "gguf" if served else "none")
                self.assertEqual(r["cpu_isa"], {"level": level, "native": native, "dtype": r["dtype"],
                                                "quantization": r["quantization"]})
                self.assertEqual((r["server_dtype"], r["server_quantization"]), (r["dtype"], r["quantization"]))
                if served:
                    self.assertTrue(r["cpu_kernels"].startswith("in use"), r["cpu_kernels"])
                    self.assertIn(f"CPU level {level}", r["cpu_kernels"])
                    self.assertGreaterEqual(r["agreement"], 0.90)
                else:
                    self.assertEqual(r["agreement"], 1.0)  # the reference path itself
                self.assertEqual(r["engine_ids"], r["own_run"])
                # `sglang plan` decides the decode path (fused kernel or the gather workspace) as the start does
                self.assertEqual(r["plan_attention_workspace"], r["attention_workspace"])


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        print(json.dumps(worker(sys.argv[2])))
    else:
        unittest.main()

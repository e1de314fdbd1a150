"""A greedy prefill (extend) batch takes its tokens from the packed lm_head's fused argmax (quant_linear_argmax.h),
as a greedy decode batch does (test_quant_serving.py), through sglang.Engine on the bundled GGUF model.

Checked, each with the forward batches recorded as BatchRunner built them (ForwardBatch.greedy_fused: the
LogitsProcessor returned token ids): a greedy batch's prefill and decode steps all run fused and give the text the
sampler's argmax of the logits gives (the fused path switched off); a batch holding requests that ask for logprobs
(output top logprobs; prompt logprobs from logprob_start_len 0) beside greedy ones keeps the logits path in every
step, and those requests return their logprobs; a prompt longer than the chunk (chunked_prefill_size 32) is
prefilled in fused steps whose chunk row is not sampled, and the texts equal the unfused ones; the fault injector's
sample step still fires in a fused prefill, failing only its request. On an AMX CPU the model runner's rule for the
quantized GEMMs (linear_method.quant_forward_rule): a decode batch of 32 requests takes the dense AMX path, a prefill
batch of 32 rows the int8 one (the dense path from 256 rows there), and the kernels' default (32) is back after each
forward.
"""

import time
from dataclasses import dataclass
from typing import List

import pytest

from sglang import Engine
from sglang.srt.layers.quantization.linear_method import QuantLinearMethod, quant_kernels
from sglang.srt.layers.vocab_embedding import ParallelLMHead
from sglang.srt.managers.batch_runner import BatchRunner
from sglang.srt.managers.fault_injection import FaultInjector, parse_rules
from sglang.srt.managers.generate_output import GenerateAccumulator
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import assert_idle_and_intact, shutdown

register_cpu_ci(est_time=25, suite="cpu")

PROMPTS = ["The three primary colors are", "Write a haiku about the ocean.\n", "def fibonacci(n):"]
SAMPLING = {"temperature": 0.0, "max_new_tokens": 16}
CHUNK = 32
LONG_PROMPT = "Here is a long story about a cat who sails to the moon. " * 8  # > 3 chunks of CHUNK tokens


@pytest.fixture(scope="module")
def engine():
    eng = Engine(max_total_memory_gb=3, chunked_prefill_size=CHUNK, log_level="warning")
    served = eng.get_server_info()["quantization"]
    if served != "gguf" or quant_kernels() is None:
        shutdown(eng)
        pytest.skip(f"the lm_head is not a packed GGUF table with the kernels here ({served}): no fused argmax")
    yield eng
    shutdown(eng)


@dataclass
class Step:
    extend: bool
    logprob: List[bool]  # per request of the batch: it asks for logprobs
    chunk: List[bool]  # per request: this step computes only part of its prompt, so it is not sampled
    fb: ForwardBatch  # greedy_fused, once the forward ran: the LogitsProcessor returned token ids


def record_steps(monkeypatch) -> List[Step]:
    steps: List[Step] = []
    build_extend, build_decode = BatchRunner._build_extend, BatchRunner._build_decode

    def extend(self, units):
        fb = build_extend(self, units)
        steps.append(Step(True, [r.return_logprob for r, _ in units], [r.kv_len + n < r.fill_len for r, n in units],
                          fb))
        return fb

    def decode(self, reqs):
        fb = build_decode(self, reqs)
        steps.append(Step(False, [r.return_logprob for r in reqs], [False] * len(reqs), fb))
        return fb

    monkeypatch.setattr(BatchRunner, "_build_extend", extend)
    monkeypatch.setattr(BatchRunner, "_build_decode", decode)
    return steps


def unfused(engine, monkeypatch, *args, **kwargs):
    """engine.generate with the lm_head giving no token ids: the sampler's argmax of the logits (from a cold cache,
    as the fused runs start)."""
    engine.flush_cache()
    with monkeypatch.context() as m:
        m.setattr(ParallelLMHead, "greedy_tokens", lambda self, hidden: None)
        return engine.generate(*args, **kwargs)


def generate_together(engine, *bodies):
    """Several generate() bodies queued before any step runs, so their requests share batches: each body's
    responses (engine.generate's objects)."""
    batches = [engine._build(dict(b)) for b in bodies]
    accs = [[GenerateAccumulator(r.rid, b.get("return_logprob", False), time.perf_counter()) for r in batch.reqs]
            for b, batch in zip(bodies, batches)]
    for batch in batches:
        engine._submit(batch.reqs)
    engine._run_to_completion([a for per_body in accs for a in per_body])
    return [[a.response() for a in per_body] for per_body in accs]


def summary(outs):
    return [(o["output_ids"], o["text"]) for o in outs]


def test_greedy_prefill_takes_the_fused_lm_head_argmax(engine, monkeypatch):
    steps = record_steps(monkeypatch)
    engine.flush_cache()
    fused = engine.generate(PROMPTS, dict(SAMPLING))
    prefills = [s for s in steps if s.extend]
    assert sum(len(s.logprob) for s in prefills) == len(PROMPTS) and not any(c for s in prefills for c in s.chunk)
    assert all(s.fb.greedy_fused for s in steps), [(s.extend, s.fb.greedy_fused) for s in steps]
    assert len(steps) > len(prefills)  # decode steps ran too
    steps.clear()
    assert summary(unfused(engine, monkeypatch, PROMPTS, dict(SAMPLING))) == summary(fused)
    assert steps and not any(s.fb.greedy_fused for s in steps)
    assert_idle_and_intact(engine)


def test_a_batch_asking_for_logprobs_keeps_the_logits(engine, monkeypatch):
    engine.flush_cache()
    greedy = summary(engine.generate(PROMPTS + [LONG_PROMPT], dict(SAMPLING)))
    steps = record_steps(monkeypatch)
    engine.flush_cache()
    # queued in this order: the long prompt's first chunk joins the greedy prompts' prefill, scoring its prompt
    # without being sampled; the top-logprob request waits for the next prefill (the chunk ends a batch)
    plain, prompt_lp, top = generate_together(
        engine, {"text": PROMPTS, "sampling_params": SAMPLING},
        {"text": LONG_PROMPT, "sampling_params": SAMPLING, "return_logprob": True, "logprob_start_len": 0},
        {"text": PROMPTS[0], "sampling_params": SAMPLING, "return_logprob": True, "top_logprobs_num": 2})
    assert summary(plain) == greedy[:3] and summary(prompt_lp + top) == [greedy[3], greedy[0]]
    # a step whose only logprob request is a chunk: the requests it samples alone would be argmax_only
    assert any(s.extend and any(s.logprob) and not any(lp and not c for lp, c in zip(s.logprob, s.chunk))
               for s in steps), [(s.logprob, s.chunk) for s in steps if s.extend]
    assert any(not s.extend and any(s.logprob) and not all(s.logprob) for s in steps)  # and decode steps beside greedy
    assert not any(s.fb.greedy_fused for s in steps if any(s.logprob))
    for out in (prompt_lp[0], top[0]):
        meta = out["meta_info"]
        assert len(meta["output_token_logprobs"]) == meta["completion_tokens"] == len(out["output_ids"])
        assert [t for _, t, _ in meta["output_token_logprobs"]] == out["output_ids"]
        assert all(lp <= 0 for lp, _, _ in meta["output_token_logprobs"])
    assert all(len(t) == 2 for t in top[0]["meta_info"]["output_top_logprobs"])
    prompt = prompt_lp[0]["meta_info"]["input_token_logprobs"]
    assert len(prompt) == prompt_lp[0]["meta_info"]["prompt_tokens"] > 3 * CHUNK
    assert prompt[0][0] is None and all(lp <= 0 for lp, _, _ in prompt[1:])
    assert_idle_and_intact(engine)


def test_chunked_prefill_gives_the_unfused_text(engine, monkeypatch):
    assert len(engine.tokenizer.encode(LONG_PROMPT)) > 3 * CHUNK
    prompts = [PROMPTS[0], LONG_PROMPT, PROMPTS[2]]
    steps = record_steps(monkeypatch)
    engine.flush_cache()
    fused = engine.generate(prompts, dict(SAMPLING))
    chunked = [s for s in steps if any(s.chunk)]
    assert len(chunked) >= 3 and all(s.extend and s.fb.greedy_fused for s in chunked)
    # a step whose chunk row is not sampled beside a request that is (the chunk comes last: prefill_scheduler.py)
    assert any(not all(s.chunk) for s in chunked), [s.chunk for s in chunked]
    assert all(s.fb.greedy_fused for s in steps)
    assert summary(unfused(engine, monkeypatch, prompts, dict(SAMPLING))) == summary(fused)
    assert_idle_and_intact(engine)


def test_a_sample_fault_in_a_fused_prefill_fails_only_its_request(engine, monkeypatch):
    engine.flush_cache()
    greedy = summary(engine.generate(PROMPTS, dict(SAMPLING)))
    steps = record_steps(monkeypatch)
    engine.flush_cache()
    engine.scheduler.faults = FaultInjector(parse_rules("sample:error:at=1"))  # the first sampled batch: the prefill
    try:
        out = engine.generate(PROMPTS, dict(SAMPLING))
    finally:
        engine.scheduler.faults = None
    assert steps[0].extend and len(steps[0].logprob) == len(PROMPTS) and steps[0].fb.greedy_fused
    reason = out[0]["meta_info"]["finish_reason"]
    assert reason["type"] == "abort" and reason["status_code"] == 500 and "The sample step failed" in reason["message"]
    assert summary(out[1:]) == greedy[1:]
    assert_idle_and_intact(engine)


def test_decode_batches_take_the_dense_path_and_prefills_the_int8_one(engine, monkeypatch):
    ops = quant_kernels()
    if not hasattr(ops, "quant_path") or not ops.quant_path(32).endswith("_dense"):
        pytest.skip("no dense path at this CPU level: it needs avx512_bf16 or amx")
    dense, int8 = ops.quant_path(32), ops.quant_path(31)  # amx: amx_bf16_dense, amx_int8; else avx512_*
    seen, mode = [], {}
    forward_local, apply = ModelRunner.forward_local, QuantLinearMethod.apply

    def forward(self, fb):
        mode["decode"] = fb.forward_mode.is_decode()
        return forward_local(self, fb)

    def recording_apply(self, layer, x, *args, **kwargs):
        rows = x.reshape(-1, x.shape[-1]).shape[0]
        seen.append((mode["decode"], rows, ops.quant_path(rows)))
        return apply(self, layer, x, *args, **kwargs)

    monkeypatch.setattr(ModelRunner, "forward_local", forward)
    monkeypatch.setattr(QuantLinearMethod, "apply", recording_apply)
    engine.flush_cache()
    prompts = [f"Count from {i} to {i + 5}:" for i in range(32)]  # 32 requests decoding together
    engine.generate(prompts, {"temperature": 0.0, "max_new_tokens": 3})
    paths = {}  # (decode forward, at least 32 rows) -> the kernels those calls took
    for decode, rows, path in seen:
        paths.setdefault((decode, rows >= 32), set()).add(path)
    assert paths[(True, True)] == {dense}, paths  # decode steps of 32 rows
    assert paths[(False, True)] == {int8}, paths  # prefill chunks of 32 rows (chunked_prefill_size)
    assert ops.quant_path(32) == dense  # the default, back after the forwards

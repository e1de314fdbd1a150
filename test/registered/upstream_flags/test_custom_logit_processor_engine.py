"""Client-sent logit processors (--enable-custom-logit-processor) through sglang.Engine, and their place in the
sampler. A forcing processor makes every token the id each request's custom_params names (rows and params stay
aligned in a batch); a request without one in the same batch gets the greedy tokens it gets alone; a processor that
raises fails its own request with the exception text and the engine keeps serving; the processor sees the raw
logits, before penalties, logit_bias and temperature (upstream's order); a malformed string is a 400-class error."""

import pytest
import torch

from sglang import Engine
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor, processor_of
from sglang.srt.sampling.sampler import sample
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.sampling.validation import ParamError
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.custom_logit_processors import client_processors
from sglang.test.engine_fixtures import shutdown

register_cpu_ci(est_time=40, suite="cpu")

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]


@pytest.fixture(scope="module")
def engine():
    e = Engine(dtype="float32", max_total_tokens=4096, max_running_requests=16, log_level="warning",
               enable_custom_logit_processor=True)
    yield e
    shutdown(e)


@pytest.fixture(scope="module")
def procs():
    return client_processors()


def greedy(engine, prompt, n=8):
    return engine.generate(prompt, {"temperature": 0, "max_new_tokens": n, "ignore_eos": True})["output_ids"]


def test_forced_rows_and_a_plain_row_in_one_batch(engine, procs):
    alone = greedy(engine, PROMPTS[1])
    out = engine.generate(PROMPTS, [
        {"temperature": 0.8, "max_new_tokens": 8, "custom_params": {"token_id": 42}},
        {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True},
        {"temperature": 0, "max_new_tokens": 8, "custom_params": {"token_id": 17}},
    ], custom_logit_processor=[procs["force"], None, procs["force"]])
    assert out[0]["output_ids"] == [42] * 8
    assert out[1]["output_ids"] == alone
    assert out[2]["output_ids"] == [17] * 8  # its own custom_params, not its neighbour's


def test_raising_processor_fails_its_request_only(engine, procs):
    out = engine.generate("Hello", {"max_new_tokens": 4}, custom_logit_processor=procs["raise"])
    reason = out["meta_info"]["finish_reason"]
    assert reason["type"] == "abort" and "the client's processor raised on purpose" in reason["message"]
    assert len(greedy(engine, PROMPTS[0], 4)) == 4


def test_malformed_processor_is_refused(engine):
    with pytest.raises(ParamError, match="custom_logit_processor"):
        engine.generate("Hello", {"max_new_tokens": 2}, custom_logit_processor='{"callable": "zz"}')


class RecordingProcessor(CustomLogitProcessor):
    seen = []

    def __call__(self, logits, custom_param_list=None):
        RecordingProcessor.seen.append((logits.clone(), [dict(p) for p in custom_param_list]))
        return logits


def test_processor_sees_raw_logits_before_penalties_bias_and_temperature():
    s = RecordingProcessor.to_str()
    processor_of.cache_clear()
    sp = SamplingParams(temperature=0.5, repetition_penalty=2.0, logit_bias={"3": 5.0}, custom_params={"k": 1})
    sp.normalize()
    with_proc = Req("a", [1, 2, 3], sp)
    with_proc.custom_logit_processor = s
    plain_sp = SamplingParams(temperature=0)
    plain_sp.normalize()
    plain = Req("b", [1, 2], plain_sp)
    logits = torch.randn(2, 16)
    raw = logits.clone()
    RecordingProcessor.seen.clear()
    sample(logits, [plain, with_proc])
    (rows, params), = RecordingProcessor.seen
    assert torch.equal(rows, raw[1:2])  # only its row, untouched by the penalty, the bias and the temperature
    assert params[0]["k"] == 1 and params[0]["__req__"] is with_proc

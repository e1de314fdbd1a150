"""The offline Engine applies the same request rules as the HTTP routes (srt/sampling/validation.py): each repro of
issue 9 finding 2 is a ValueError naming the parameter and the allowed range, with the exact sentence /generate
answers (tested in openai_server/test_request_validation.py); nothing is left allocated and the engine still
generates, including at the extreme allowed values, where the sampler must stay finite."""

import pytest

from sglang import Engine
from sglang.srt.sampling import validation as v
from sglang.srt.sampling.validation import ParamError
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import assert_idle_and_intact as idle_and_intact, shutdown

register_cpu_ci(est_time=25, suite="cpu")


@pytest.fixture(scope="module")
def engine():
    e = Engine(context_length=128, max_total_memory_gb=1.5, chunked_prefill_size=128, log_level="warning")
    yield e
    shutdown(e)


CASES = [
    ({"skip_special_tokens": "no"}, "skip_special_tokens",
     "Invalid value for sampling_params.skip_special_tokens: Input should be a valid boolean (got 'no'). "
     "Allowed: true or false."),
    ({"spaces_between_special_tokens": 1}, "spaces_between_special_tokens", "Allowed: true or false."),
    ({"temperature": 1e39, "min_new_tokens": 1}, "temperature",
     "Invalid value for sampling_params.temperature: Input should be less than or equal to 2 "
     "(got 1e+39). "
     "Allowed: a finite number in [0, 2] (0 is greedy)."),
    ({"temperature": float("nan")}, "temperature", "Input should be a finite number (got nan)"),
    ({"repetition_penalty": 1e-300}, "repetition_penalty",
     "Invalid value for sampling_params.repetition_penalty: Input should be greater than or equal to 0.01 "
     "(got 1e-300). "
     "Allowed: a finite number in [0.01, 2] (1 is off)."),
    ({"seed": 2**64 - 1, "n": 2}, "seed", "Input should be less than or equal to 9223372036854775807"),
    ({"seed": 2**63 - 1, "n": 2}, "seed",
     "Invalid value for sampling_params.seed: With n=2, the last choice's seed (seed + 1) exceeds 2^63-1 "
     "(got 9223372036854775807). "
     "Allowed: an integer in [0, 2^63-1 - (n-1)] = [0, 9223372036854775806]."),
    ({"top_k": 0}, "top_k", "Allowed: -1 (no top-k cut) or an integer in [1, 2^31-1]."),
    ({"stop": ["a"] * 5}, "stop", "at most 4 items"),
    ({"stop": "x" * 600}, "stop", "at most 512 characters"),
    ({"n": 129}, "n", "Allowed: an integer in [1, 128]."),
    ({"min_new_tokens": 9, "max_new_tokens": 4}, "min_new_tokens", "should not exceed max_new_tokens (4)"),
]


@pytest.mark.parametrize("params,param,fragment", CASES, ids=[f"{c[1]}-{i}" for i, c in enumerate(CASES)])
def test_engine_rejects_with_the_shared_rules(engine, params, param, fragment):
    with pytest.raises(ValueError) as e:
        engine.generate("Hello", params)
    assert isinstance(e.value, ParamError) and e.value.param == "sampling_params." + param
    assert fragment in str(e.value), str(e.value)
    idle_and_intact(engine)


def test_engine_checks_stop_token_ids_against_the_vocabulary(engine):
    with pytest.raises(ValueError, match=r"Invalid value for sampling_params.stop_token_ids: Token ID 1000000 is "
                                         r"out of vocabulary \(an out-of-vocabulary id: outside the "
                                         r"vocabulary\) .* Allowed: token ids in \[0, 49152\)"):
        engine.generate("Hello", {"stop_token_ids": [10**6], "max_new_tokens": 2})
    idle_and_intact(engine)


def test_engine_generates_at_the_limits(engine):
    params = {"temperature": v.MAX_TEMPERATURE, "min_new_tokens": 3, "max_new_tokens": 4,
              "repetition_penalty": v.MIN_REPETITION_PENALTY, "presence_penalty": 2.0, "seed": v.MAX_SEED}
    out = engine.generate("Hello", params)
    assert len(out["output_ids"]) >= 3
    idle_and_intact(engine)

"""Bad input to the offline engine: clear ValueErrors that name the limit (the sentences of /generate, see
test_generate_parity.py), and nothing left allocated afterwards."""

import pytest

from sglang import Engine
from sglang.srt.server_args import ServerArgs
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import assert_idle_and_intact as idle_and_intact, shutdown

register_cpu_ci(est_time=20, suite="cpu")


@pytest.fixture(scope="module")
def engine():
    e = Engine(context_length=128, max_total_memory_gb=1.5, chunked_prefill_size=128, log_level="warning")
    yield e
    shutdown(e)


def test_prompt_longer_than_context(engine):
    with pytest.raises(ValueError,
                       match=r"longer than the model's context length \(128 tokens; at most 127 input tokens"):
        engine.generate("word " * 400, {"max_new_tokens": 4})
    idle_and_intact(engine)


def test_prompt_plus_max_new_tokens_over_context(engine):
    # upstream's sentence first (clients match on it), then what to change here
    with pytest.raises(ValueError) as e:
        engine.generate("word " * 60, {"max_new_tokens": 100})
    n = len(engine.request_tokenizer.encode("word " * 60))
    assert str(e.value) == (
        f"Requested token count exceeds the model's maximum context length of 128 tokens. You requested a total of "
        f"{n + 100} tokens: {n} tokens from the input messages and 100 tokens for the completion. Reduce the prompt "
        f"or set max_new_tokens to at most {128 - n}.")
    idle_and_intact(engine)


def test_empty_prompt(engine):
    with pytest.raises(ValueError, match="empty"):
        engine.generate("", {"max_new_tokens": 4})
    with pytest.raises(ValueError, match="empty"):
        engine.generate(input_ids=[], sampling_params={"max_new_tokens": 4})
    idle_and_intact(engine)


def test_token_ids_outside_vocab(engine):
    with pytest.raises(ValueError, match=r"Token id 1000000 is out of range; token ids must be in \[0, 49152\)"):
        engine.generate(input_ids=[1, 2, 10**6], sampling_params={"max_new_tokens": 4})
    idle_and_intact(engine)


@pytest.mark.parametrize("params,needle", [
    ({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"), ({"top_k": 0}, "top_k"),
    ({"max_new_tokens": -5}, "max_new_tokens"), ({"bogus": 1}, "bogus"),
])
def test_invalid_sampling_params(engine, params, needle):
    with pytest.raises(ValueError, match=needle):
        engine.generate("Hello", params)
    idle_and_intact(engine)


def test_a_bad_request_in_a_batch_leaves_nothing_behind(engine):
    with pytest.raises(ValueError, match="longer than"):
        engine.generate(["Hello there", "word " * 400], {"max_new_tokens": 4})
    idle_and_intact(engine)
    out = engine.generate("Hello there", {"temperature": 0, "max_new_tokens": 4})
    assert len(out["output_ids"]) == 4
    idle_and_intact(engine)


def test_server_args_validation_names_the_flag():
    with pytest.raises(ValueError, match=r"--mem-fraction-static must be in \(0, 1\)"):
        ServerArgs(mem_fraction_static=1.5)
    with pytest.raises(ValueError, match=r"--schedule-policy='lifo' is not allowed; choose one of fcfs, lpm, random"):
        ServerArgs(schedule_policy="lifo")
    with pytest.raises(ValueError, match=r"--page-size must be a positive number"):
        ServerArgs(page_size=0)
    with pytest.raises(ValueError, match=r"--nnodes 2 / --node-rank 0: .* nnodes dividing --tp-size 3"):
        ServerArgs(tp_size=3, nnodes=2, dist_init_addr="127.0.0.1:5000")
    with pytest.raises(ValueError, match=r"--nnodes > 1 needs --dist-init-addr"):
        ServerArgs(tp_size=2, nnodes=2)
    with pytest.raises(ValueError, match=r"--pp-size 2: pipeline parallelism is not supported"):
        ServerArgs(pp_size=2)


if __name__ == "__main__":
    pytest.main([__file__, "-q"])

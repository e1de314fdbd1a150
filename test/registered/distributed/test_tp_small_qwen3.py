"""Tensor parallelism on a small random-weight Qwen3 (4 heads, 2 KV heads, intermediate 256, vocab 512) built here:
fp32 greedy tokens (and prompt logprobs, within 1e-4) identical at tp=1, 2 and 4 (tp=4 replicates each KV head on two ranks), and at bf16 the
logprobs of the tp=2 tokens within the usual tolerance of tp=1's. Also the startup error for a tp that does not
divide the model's heads."""

import pytest

from sglang import Engine
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import assert_idle_and_intact, make_random_qwen3, shutdown

register_cpu_ci(est_time=20, suite="cpu")

PROMPTS = [[5, 17, 300, 42, 9], [100, 200, 300], [7] * 12, list(range(20, 60)), [511, 0, 3, 77, 250, 1, 2]]
GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
# bf16 logprobs of the same token differ between reduction orders by a few bf16 ulps of the logits
BF16_LOGPROB_TOLERANCE = 0.1


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return make_random_qwen3(str(tmp_path_factory.mktemp("qwen3") / "m"))


def run(model_path, tp: int, dtype: str = "float32", **sampling):
    engine = Engine(model_path=model_path, dtype=dtype, skip_tokenizer_init=True, tp_size=tp, max_total_memory_gb=0.5,
                    log_level="warning", random_seed=0)
    try:
        outs = engine.generate(input_ids=PROMPTS, sampling_params=dict(GREEDY, **sampling), return_logprob=True,
                               logprob_start_len=0)
        assert_idle_and_intact(engine)
        ranks = engine.get_server_info()["memory_plan_per_rank"]
        assert len(ranks) == tp and len({r["max_total_num_tokens"] for r in ranks}) == 1
        return outs
    finally:
        shutdown(engine)


@pytest.fixture(scope="module")
def fp32_tp1(model_path):
    return run(model_path, 1)


@pytest.mark.parametrize("tp", [2, 4])
def test_fp32_greedy_tokens_equal_tp1(model_path, fp32_tp1, tp):
    outs = run(model_path, tp)
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in fp32_tp1]
    for a, b in zip(outs, fp32_tp1):  # prompt logprobs: every rank projects the same row blocks
        got, want = a["meta_info"]["input_token_logprobs"], b["meta_info"]["input_token_logprobs"]
        assert [t for _, t, _ in got] == [t for _, t, _ in want] and got[0][0] is None
        assert all(abs(x[0] - y[0]) <= 1e-4 for x, y in zip(got[1:], want[1:])), (got, want)


def test_bf16_logprobs_within_tolerance(model_path):
    ref, got = run(model_path, 1, "bfloat16"), run(model_path, 2, "bfloat16")
    for a, b in zip(ref, got):
        n = 0
        for (lp_a, tok_a, _), (lp_b, tok_b, _) in zip(a["meta_info"]["output_token_logprobs"],
                                                      b["meta_info"]["output_token_logprobs"]):
            if tok_a != tok_b:  # a near-tie flipped: the continuations differ from here on
                break
            assert abs(lp_a - lp_b) <= BF16_LOGPROB_TOLERANCE, (lp_a, lp_b)
            n += 1
        assert n >= 1


def test_tp_not_dividing_the_model_is_refused(model_path):
    with pytest.raises(ValueError, match="does not divide the model's 4 attention heads"):
        Engine(model_path=model_path, dtype="float32", skip_tokenizer_init=True, tp_size=3, log_level="warning")

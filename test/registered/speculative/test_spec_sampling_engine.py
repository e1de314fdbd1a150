"""Sampling under NGRAM speculative decoding through sglang.Engine keeps the target's distribution: one engine decodes
with its SpecDecoder and with it swapped out (runner.spec = None while idle).

A random Qwen3 over a 4-token vocabulary (no tokenizer) makes n-gram proposals frequent and often accepted at
temperature 1: every seed gives identical tokens with and without speculation, and unseeded draws of the committed
tokens pass a two-sample chi-square against non-speculative decoding (an always-accepting verify fails it). A random
Qwen3 with the SmolLM2 tokenizer serves JSON-schema requests with proposals: the output equals non-speculative
decoding's and parses. The CPU verify budget (spec_sizes.CPU_VERIFY_TOKEN_BUDGET, a speed policy) is raised so the
batches here get proposals."""

import json

import pytest
import torch

from sglang import Engine
from sglang.srt.managers import spec_decode
from sglang.srt.sampling.sampler import SampleOutput, sample
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import assert_idle_and_intact, shutdown, spread_random_weights
from sglang.test.spec_fixtures import spec_off

register_cpu_ci(est_time=120, suite="cpu")

SMALL_VOCAB = 4
PROMPT = [0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
BATCH = 8  # max_running_requests: every request of a batch gets proposals under the raised budget


def make_small_vocab_qwen3(path: str) -> str:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=SMALL_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                      tie_word_embeddings=False, eos_token_id=None, bos_token_id=None)
    model = spread_random_weights(Qwen3ForCausalLM(cfg).to(torch.float32), std=0.3)
    model.save_pretrained(path, safe_serialization=True)
    return path


def make_tokenizer_qwen3(path: str) -> str:
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    from sglang.test.engine_fixtures import default_model_dir

    tok = AutoTokenizer.from_pretrained(default_model_dir())
    torch.manual_seed(1)
    cfg = Qwen3Config(vocab_size=(len(tok) + 63) // 64 * 64, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      max_position_embeddings=512, tie_word_embeddings=False, eos_token_id=tok.eos_token_id,
                      bos_token_id=tok.bos_token_id)
    spread_random_weights(Qwen3ForCausalLM(cfg).to(torch.float32)).save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path


def start(path: str, **kw) -> Engine:
    e = Engine(model_path=path, dtype="float32", speculative_algorithm="NGRAM", max_running_requests=BATCH,
               max_total_memory_gb=0.5, log_level="warning", **kw)
    e.scheduler.runner.spec.policy.verify_token_budget = BATCH * 8
    return e


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    e = start(make_small_vocab_qwen3(str(tmp_path_factory.mktemp("small"))), skip_tokenizer_init=True)
    yield e
    shutdown(e)


def generate_ids(engine, params, n):
    outs = engine.generate(input_ids=[PROMPT] * n, sampling_params=params)
    assert_idle_and_intact(engine)
    return [o["output_ids"] for o in outs]


def spec_counts(engine):
    st = engine.scheduler.get_stats()
    return st["spec_proposed_tokens"], st["spec_accepted_tokens"]


def test_every_seed_gives_the_same_tokens(small):
    params = [{"temperature": 1.0, "max_new_tokens": 12, "seed": s} for s in range(32)]
    (p0, a0), faults = spec_counts(small), small.scheduler.get_stats()["num_faults"]
    got = generate_ids(small, params, len(params))
    p1, a1 = spec_counts(small)
    assert p1 - p0 > a1 - a0 > 0, (p1 - p0, a1 - a0)  # proposals made, some kept, some rejected
    assert small.scheduler.get_stats()["num_faults"] == faults
    with spec_off(small):
        want = generate_ids(small, params, len(params))
    assert got == want
    assert len({tuple(g) for g in got}) > 8  # the seeds draw different texts


def chi_square_two_sample_p(a, b):
    """p of the chi-square test that two samples of categories come from one distribution."""
    from scipy.stats import chi2_contingency

    keys = sorted(set(a) | set(b))
    table = [[a.count(k) for k in keys], [b.count(k) for k in keys]]
    return chi2_contingency(table).pvalue


N_DRAWS = 320
UNSEEDED = {"temperature": 1.0, "max_new_tokens": 4}


def pairs(outs):
    """Two statistics over the committed tokens: the first pair and the second pair (16 categories each)."""
    return [tuple(o[:2]) for o in outs], [tuple(o[2:4]) for o in outs]


@pytest.fixture(scope="module")
def non_speculative_draws(small):
    torch.manual_seed(11)
    with spec_off(small):
        return pairs(generate_ids(small, UNSEEDED, N_DRAWS))


def test_unseeded_draws_follow_non_speculative_decoding(small, non_speculative_draws):
    torch.manual_seed(12)
    p0, a0 = spec_counts(small)
    got = pairs(generate_ids(small, UNSEEDED, N_DRAWS))
    p1, a1 = spec_counts(small)
    assert a1 - a0 > N_DRAWS // 8, (p1 - p0, a1 - a0)  # ~100 kept of ~700 proposed
    for g, w in zip(got, non_speculative_draws):
        assert chi_square_two_sample_p(g, w) > 1e-3 / 2  # two tests: Bonferroni


def always_accepting_verify(logits, reqs, proposals, offsets, commit, grammar_bitmask):
    """The mutant: keeps every proposal, then samples the bonus token from the last row."""
    for i, (req, props) in enumerate(zip(reqs, proposals)):
        done = False
        for d in props:
            if not commit(i, SampleOutput([d]), 0):
                done = True
                break
        if not done:
            row = offsets[i] + len(props)
            commit(i, sample(logits[row: row + 1], [req]), 0)
    return [len(p) + 1 for p in proposals]


def test_the_chi_square_fails_an_always_accepting_verify(small, non_speculative_draws, monkeypatch):
    monkeypatch.setattr(spec_decode, "verify", always_accepting_verify)
    torch.manual_seed(13)
    got = pairs(generate_ids(small, UNSEEDED, N_DRAWS // 4))  # p ~1e-80 at N_DRAWS: a quarter is plenty
    assert min(chi_square_two_sample_p(g, w) for g, w in zip(got, non_speculative_draws)) < 1e-3


# ----------------------------------------------------------------------------------------------------- JSON schema
SCHEMA = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}, "n": {"type": "boolean"}},
          "required": ["color", "n"], "additionalProperties": False}
JSON_PROMPT = 'Echo: {"color": "red", "n": true} {"color": "red", "n": true} {"color": "red", "n": true} {"color": "'


def test_json_schema_with_proposals_equals_non_speculative_and_parses(tmp_path, monkeypatch):
    e = start(make_tokenizer_qwen3(str(tmp_path / "tok")))
    try:
        spec = e.scheduler.runner.spec
        # every request proposes its full chain every step (no pauses after rejections), so the grammar path is used
        monkeypatch.setattr(spec.policy, "max_k", lambda reqs: [
            max(0, min(spec.policy.max_proposals, r.remaining_new_tokens() - 1)) for r in reqs])
        params = [{"json_schema": json.dumps(SCHEMA), "max_new_tokens": 48, **sp}
                  for sp in ({"temperature": 0}, {"temperature": 1.0, "seed": 3}, {"temperature": 1.0, "seed": 4})]
        (p0, a0), faults = spec_counts(e), e.scheduler.get_stats()["num_faults"]
        got = e.generate([JSON_PROMPT] * len(params), params)
        assert_idle_and_intact(e)
        (p1, a1) = spec_counts(e)
        # proposals were kept under the grammar, and no step faulted (a fault recovers as a plain decode)
        assert p1 - p0 > a1 - a0 > 0 and e.scheduler.get_stats()["num_faults"] == faults, (p1 - p0, a1 - a0)
        assert all(o["meta_info"]["spec_verify_ct"] > 0 for o in got)
        with spec_off(e):
            want = e.generate([JSON_PROMPT] * len(params), params)
        for a, b in zip(got, want):
            assert a["output_ids"] == b["output_ids"] and a["text"] == b["text"]
            assert a["meta_info"]["finish_reason"]["type"] == "stop", a["meta_info"]["finish_reason"]
            obj = json.loads(a["text"])
            assert obj["color"] in ("red", "green", "blue") and isinstance(obj["n"], bool)
    finally:
        shutdown(e)

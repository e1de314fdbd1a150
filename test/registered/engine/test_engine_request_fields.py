"""Upstream's request fields through sglang.Engine (issue 28): stop_regex, cache_salt, return_text_in_logprobs.

References are independent of the runtime: the greedy text without stop_regex searched by Python's `re`, the HF
tokenizer's decode of each id, and the cached-token counts the prefix-cache rules imply."""

import re
import uuid

import pytest

from sglang import Engine
from sglang.srt.managers.incremental_detokenizer import find_stop_regex, regex_held_back_len
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import assert_idle_and_intact, default_model_dir, shutdown

register_cpu_ci(est_time=30, suite="cpu")

PROMPT = "The three primary colors are"
GREEDY = {"temperature": 0, "max_new_tokens": 32, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine():
    e = Engine(context_length=512, max_total_tokens=4096, log_level="warning")
    yield e
    shutdown(e)


@pytest.fixture(scope="module")
def greedy_text(engine):
    return engine.generate(PROMPT, GREEDY)["text"]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir())


def word_pattern(word: str) -> str:
    """A real regex for `word`: each letter as a two-case class ("blue" -> "[bB][lL][uU][eE]")."""
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else re.escape(c) for c in word)


def unique_middle_word(text: str, after: int = 0) -> str:
    """A word from the middle of `text` (past index `after`) whose pattern matches `text` exactly once."""
    words = [m for m in re.finditer(r"[A-Za-z]{3,}", text) if m.start() > after]
    words.sort(key=lambda m: abs(m.start() - len(text) // 2))
    for m in words:
        if len(re.findall(word_pattern(m.group()), text)) == 1:
            return m.group()
    pytest.skip(f"no word of the greedy text occurs once: {text!r}")


def test_stop_regex_cuts_at_the_match_and_reports_the_pattern(engine, greedy_text):
    pattern = word_pattern(unique_middle_word(greedy_text))
    m = re.search(pattern, greedy_text)
    out = engine.generate(PROMPT, {**GREEDY, "stop_regex": pattern})
    assert out["text"] == greedy_text[: m.start()]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": pattern}
    # no_stop_trim keeps the matched text, as with stop strings
    kept = engine.generate(PROMPT, {**GREEDY, "stop_regex": [pattern], "no_stop_trim": True})
    assert kept["text"] == greedy_text[: m.end()]


def test_earliest_of_several_patterns_and_stop_strings_wins(engine, greedy_text):
    first = unique_middle_word(greedy_text)
    start = re.search(word_pattern(first), greedy_text).start()
    later = unique_middle_word(greedy_text, after=start + len(first))
    p_first, p_later = word_pattern(first), word_pattern(later)
    out = engine.generate(PROMPT, {**GREEDY, "stop_regex": [p_later, p_first], "stop": [later]})
    assert out["text"] == greedy_text[:start]
    assert out["meta_info"]["finish_reason"]["matched"] == p_first
    # a stop string before the regex's match wins over it
    out = engine.generate(PROMPT, {**GREEDY, "stop_regex": p_later, "stop": first})
    assert out["text"] == greedy_text[:start] and out["meta_info"]["finish_reason"]["matched"] == first


def test_streamed_text_never_shows_a_match_that_spans_tokens(engine, greedy_text):
    # a pattern that begins many tokens before it completes: everything from its start is held back, then cut
    first = unique_middle_word(greedy_text)
    start = re.search(word_pattern(first), greedy_text).start()
    later = unique_middle_word(greedy_text, after=start + len(first))
    pattern = word_pattern(first) + r"[\s\S]*?" + word_pattern(later)
    assert re.search(pattern, greedy_text).start() == start
    seen = []
    for obj in engine.generate(PROMPT, {**GREEDY, "stop_regex": pattern}, stream=True):
        seen.append(obj["text"])
    final = seen[-1]
    assert final == greedy_text[:start]
    assert all(final.startswith(t) for t in seen), "streamed text was taken back"
    assert_idle_and_intact(engine)


def test_invalid_stop_regex_is_refused_naming_the_field(engine):
    for bad in ["(unclosed", ["ok", "[z-a]"], "a*"]:
        with pytest.raises(ValueError, match=r"sampling_params\.stop_regex"):
            engine.generate(PROMPT, {"max_new_tokens": 2, "stop_regex": bad})
    assert_idle_and_intact(engine)


def test_catastrophic_stop_regex_fails_only_its_request(engine, tokenizer):
    # logit_bias forces "a" tokens; (a|a)+c backtracks exponentially on a run of a's: the search times out and the
    # request ends with a 400 naming stop_regex instead of stalling the scheduler
    a_id = tokenizer.encode("a", add_special_tokens=False)[0]
    out = engine.generate(PROMPT, {"temperature": 0, "max_new_tokens": 64, "ignore_eos": True,
                                   "logit_bias": {str(a_id): 100.0}, "stop_regex": "(a|a)+c"})
    reason = out["meta_info"]["finish_reason"]
    assert reason["type"] == "abort" and reason["status_code"] == 400 and "stop_regex" in reason["message"], reason
    assert engine.generate(PROMPT, {"max_new_tokens": 2})["meta_info"]["finish_reason"]["type"] == "length"
    assert_idle_and_intact(engine)


def test_regex_helpers():
    import regex

    pats = [regex.compile(r"ab+c"), regex.compile(r"x\d")]
    assert find_stop_regex("zzabbbc x1", pats) == (2, 7, r"ab+c")
    assert find_stop_regex("x1 abc", pats) == (0, 2, r"x\d")
    assert find_stop_regex("zz", pats) is None
    assert regex_held_back_len("hello abb", pats) == 3  # "abb" may still become "abbc"
    assert regex_held_back_len("hello x", pats) == 1
    assert regex_held_back_len("hello", pats) == 0


def test_cache_salt_separates_prefix_cache_entries(engine):
    engine.flush_cache()
    prompt = " ".join(uuid.uuid4().hex for _ in range(6))  # ~180 tokens, in no cache yet
    cached = lambda salt: engine.generate(prompt, {"max_new_tokens": 1}, cache_salt=salt)["meta_info"]["cached_tokens"]
    assert cached("alice") == 0
    assert cached("bob") == 0  # a different salt never shares
    assert cached("alice") > 0  # the same salt does
    assert cached(None) == 0  # unsalted shares only with unsalted
    assert cached(None) > 0
    assert cached("carol") == 0
    # a batch with one salt per prompt
    outs = engine.generate([prompt, prompt], {"max_new_tokens": 1}, cache_salt=["alice", "dave"])
    assert outs[0]["meta_info"]["cached_tokens"] > 0 and outs[1]["meta_info"]["cached_tokens"] == 0
    assert_idle_and_intact(engine)
    with pytest.raises(ValueError, match="cache_salt"):
        engine.generate([prompt, prompt], {"max_new_tokens": 1}, cache_salt=["a", "b", "c"])


def test_return_text_in_logprobs(engine, tokenizer):
    out = engine.generate(PROMPT, {"max_new_tokens": 4, "temperature": 0}, return_logprob=True, top_logprobs_num=3,
                          logprob_start_len=0, return_text_in_logprobs=True)
    meta = out["meta_info"]
    entries = meta["output_token_logprobs"] + meta["input_token_logprobs"]
    entries += [e for top in meta["output_top_logprobs"] + meta["input_top_logprobs"] if top for e in top]
    assert len(entries) > 4 + len(tokenizer.encode(PROMPT))
    for lp, tid, text in entries:
        assert text == tokenizer.decode([tid]), (tid, text)
    plain = engine.generate(PROMPT, {"max_new_tokens": 2}, return_logprob=True, top_logprobs_num=1)
    assert all(e[2] is None for e in plain["meta_info"]["output_token_logprobs"])
    assert_idle_and_intact(engine)


if __name__ == "__main__":
    pytest.main([__file__, "-q"])


def test_require_reasoning_through_the_engine(engine, monkeypatch):
    import dataclasses

    params = {"max_new_tokens": 6, "temperature": 0}
    plain = engine.generate("The sky is", params)
    # without --reasoning-parser: upstream's no-op, a grammar included
    assert engine.generate("The sky is", params, require_reasoning=True)["output_ids"] == plain["output_ids"]
    regex = {**params, "regex": "[a-z ]{3,12}"}
    assert engine.generate("The sky is", regex, require_reasoning=True)["text"]
    # with a reasoning parser and a grammar it would change the output: refused as /generate refuses it
    monkeypatch.setattr(engine, "server_args", dataclasses.replace(engine.server_args, reasoning_parser="qwen3"))
    with pytest.raises(ValueError, match="require_reasoning"):
        engine.generate("The sky is", regex, require_reasoning=True)
    assert engine.generate("The sky is", params, require_reasoning=True)["output_ids"] == plain["output_ids"]

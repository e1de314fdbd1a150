"""The retraction scenario the engine tests of the hybrid, MLA and windowed models share (qwen3_next, nemotron_h,
deepseek, gpt_oss): more concurrent requests than a 256-token pool holds, so decode must retract some of them and a
retracted request re-prefills (from the zero state for a recurrent layer). Before and after the run the allocator is
idle and intact, so a leak of the scenario before it or of the retraction itself fails where it happens."""

from __future__ import annotations

from typing import List, Tuple

from sglang.test.engine_fixtures import assert_idle_and_intact

RETRACT_NEW_TOKENS = 32


def retraction_prompts(vocab: int) -> List[List[int]]:
    """8 prompts of 11-14 tokens: with 32 new tokens each, 8 x (11-14 + 32) tokens exceed a 256-token pool."""
    return [[(13 * i + 7 * j + 3) % vocab for j in range(11 + i % 4)] for i in range(8)]


def greedy(n: int) -> dict:
    return {"temperature": 0, "max_new_tokens": n, "ignore_eos": True}


def run_retraction(engine, prompts: List[List[int]], max_new_tokens: int = RETRACT_NEW_TOKENS
                   ) -> Tuple[List[List[int]], int]:
    """(each request's greedy tokens, how many retractions this run made); idle and intact before and after."""
    assert_idle_and_intact(engine)
    before = engine.scheduler.num_retractions
    outs = engine.generate(input_ids=prompts, sampling_params=greedy(max_new_tokens))
    assert_idle_and_intact(engine)
    return [o["output_ids"] for o in outs], engine.scheduler.num_retractions - before

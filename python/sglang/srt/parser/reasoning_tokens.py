"""usage.completion_tokens_details.reasoning_tokens: how many of a choice's output tokens are its reasoning.

The reasoning part is the output from its start (or an opening <think>) up to and including the token that completes
</think>, found on the text as reasoning_parser.py reads it; an output that ends inside its reasoning is all
reasoning, and one the parser reads as having none (qwen3 without an opening tag) has 0. The tag may be several
tokens (a model without a </think> token spells it out), so the count is the shortest run of output tokens whose
decoded text holds the tag: a binary search over decoded prefixes, once per choice when it finishes.
"""

from __future__ import annotations

from typing import Callable, Sequence

from sglang.srt.parser.reasoning_parser import THINK_END, ReasoningParser


def count_reasoning_tokens(parser_name: str, token_ids: Sequence[int], decode: Callable[[Sequence[int]], str]) -> int:
    """decode: token ids -> text (the tokenizer's, skipping special tokens as the output text does)."""
    if not token_ids:
        return 0
    parser = ReasoningParser(parser_name)
    parser.split(decode(token_ids))
    if not parser.entered_reasoning:
        return 0
    if THINK_END not in decode(token_ids):
        return len(token_ids)
    lo, hi = 1, len(token_ids)  # the shortest prefix holding the tag lies in (lo - 1, hi]
    while lo < hi:
        mid = (lo + hi) // 2
        if THINK_END in decode(token_ids[:mid]):
            hi = mid
        else:
            lo = mid + 1
    return hi

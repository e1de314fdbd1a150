"""Prompt logprobs (ReqOutput.input_token_logprobs / input_top_logprobs, managers/prompt_logprob_state.py) in the two
shapes OpenAI-style clients read:

  legacy echo     /v1/completions with echo + logprobs: the prompt's tokens lead the choice's logprobs block --
                  tokens, token_logprobs (the first is null: nothing precedes it), top_logprobs (null first),
                  text_offset from 0 -- then the generated tokens (OpenAI's legacy API; what lm-evaluation-harness's
                  local-completions reads for every log-likelihood)
  prompt_logprobs vLLM's extension on completions (per choice) and chat (on the response): per prompt token null
                  (the first) or {"<token id>": {"logprob", "rank", "decoded_token"}} holding the prompt token and the
                  top-N (N = prompt_logprobs)
"""

from __future__ import annotations

from typing import List, Optional

from sglang.srt.managers.io_struct import ReqOutput


def legacy_prompt_block(tm, out: ReqOutput, top_n: int) -> dict:
    """The echoed prompt's part of a legacy logprobs block (text_offset from 0)."""
    entries = out.input_token_logprobs or []
    tokens = [tm.token_str(tid) for _, tid, _ in entries]
    offsets, pos = [], 0
    for tok in tokens:
        offsets.append(pos)
        pos += len(tok)
    tops = out.input_top_logprobs or [None] * len(entries)
    top = [None if pairs is None else {tm.token_str(t): lp for t, lp in pairs[:top_n]} for pairs in tops]
    return {"tokens": tokens, "token_logprobs": [lp for lp, _, _ in entries],
            "top_logprobs": top if top_n else None, "text_offset": offsets}


def join_blocks(prompt: dict, gen: Optional[dict]) -> dict:
    """Prompt block then generated block (the generated text_offsets already start after the echoed text)."""
    if gen is None:
        return prompt
    top = None
    if prompt["top_logprobs"] is not None or gen["top_logprobs"] is not None:
        top = (prompt["top_logprobs"] or [None] * len(prompt["tokens"])) + (gen["top_logprobs"] or [])
    return {"tokens": prompt["tokens"] + gen["tokens"], "token_logprobs": prompt["token_logprobs"] + gen["token_logprobs"],
            "top_logprobs": top, "text_offset": prompt["text_offset"] + gen["text_offset"]}


def vllm_prompt_logprobs(tm, out: ReqOutput, top_n: int) -> Optional[List[Optional[dict]]]:
    if out.input_token_logprobs is None:
        return None
    tops = out.input_top_logprobs or [None] * len(out.input_token_logprobs)
    result: List[Optional[dict]] = []
    for (lp, tid, rank), pairs in zip(out.input_token_logprobs, tops):
        if lp is None:
            result.append(None)
            continue
        entry = {str(tid): {"logprob": lp, "rank": rank, "decoded_token": tm.token_str(tid)}}
        for r, (t, v) in enumerate((pairs or [])[:top_n], start=1):
            entry.setdefault(str(t), {"logprob": v, "rank": r, "decoded_token": tm.token_str(t)})
        result.append(entry)
    return result

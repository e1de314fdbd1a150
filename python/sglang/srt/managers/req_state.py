"""The main process's per-request state: output deltas received from the scheduler and not yet consumed."""

from __future__ import annotations

import asyncio
import copy
import time
from dataclasses import dataclass, field
from typing import List

from sglang.srt.managers.io_struct import ReqOutput
from sglang.srt.managers.prompt_logprob_state import PROMPT_LOGPROB_FIELDS


@dataclass
class ReqState:
    """Outputs received for one request id and not yet consumed by its waiting coroutine."""

    pending: List[ReqOutput] = field(default_factory=list)
    event: asyncio.Event = field(default_factory=asyncio.Event)
    finished: bool = False
    created_time: float = field(default_factory=time.perf_counter)
    last_time: float = 0.0
    num_output_tokens: int = 0
    metered: bool = True  # counted in the metrics (health probes are not)
    counted: bool = False  # its finish is in the metrics (once: a finish output, or its client leaving first)


def merge_outputs(outs: List[ReqOutput]) -> ReqOutput:
    """Concatenate consecutive deltas of one request into one delta (totals and finish state from the last)."""
    if len(outs) == 1:
        return outs[0]
    last = outs[-1]
    merged = copy.copy(last)
    merged.new_token_ids = [t for o in outs for t in o.new_token_ids]
    merged.new_text = "".join(o.new_text for o in outs)
    if any(o.new_token_logprobs is not None for o in outs):
        merged.new_token_logprobs = [x for o in outs for x in (o.new_token_logprobs or [])]
    if any(o.new_top_logprobs is not None for o in outs):
        merged.new_top_logprobs = [x for o in outs for x in (o.new_top_logprobs or [])]
    if any(o.new_token_ids_logprobs is not None for o in outs):
        merged.new_token_ids_logprobs = [x for o in outs for x in (o.new_token_ids_logprobs or [])]
    for name in PROMPT_LOGPROB_FIELDS:  # sent once, with one of the deltas
        setattr(merged, name, next((getattr(o, name) for o in outs if getattr(o, name) is not None), None))
    return merged

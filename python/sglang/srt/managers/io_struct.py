"""Typed messages between the stages of the runtime.

    API (Engine.generate / HTTP)          text or ids, sampling params as a dict (keyword args / request body)
        -> tokenizer (main process)      TokenizedGenerateReqInput  ids + validated SamplingParams
        -> Scheduler (same process for the offline Engine, its own process behind ZMQ for the server)
        -> per step                      ReqOutput               the new tokens/text of one request since last time
    control:                             AbortReq, FlushCacheReq, GetInfoReq (+ their replies as plain dicts)

Every message is a plain dataclass so it pickles cheaply over ZMQ.
"""

from __future__ import annotations

import operator
import uuid
from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Optional

from sglang.srt.sampling.sampling_params import SamplingParams


def new_rid() -> str:
    return uuid.uuid4().hex


@dataclass
class TokenizedGenerateReqInput:
    rid: str
    input_text: Optional[str]
    input_ids: List[int]
    sampling_params: SamplingParams
    stream: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = 0
    # upstream's prompt logprobs: positions [logprob_start_len, len(input_ids)) (-1: none), and the logprobs of
    # these token ids at every returned position (prompt and output)
    logprob_start_len: int = -1
    token_ids_logprob: Optional[List[int]] = None
    # multimodal: preprocessed image inputs (filled by the multimodal processor), opaque to text models
    mm_inputs: Optional[Any] = None
    # an embedding request (POST /v1/embeddings, Engine.encode): served only by an --is-embedding server, which
    # serves nothing else
    is_embedding: bool = False
    # upstream's client-sent logit processor (sampling/custom_logit_processor.py; --enable-custom-logit-processor)
    custom_logit_processor: Optional[str] = None
    # upstream's cache_salt: prefix-cache entries are shared only between requests with the same salt (or none)
    cache_salt: Optional[str] = None


@dataclass
class ReqOutput:
    """What one request produced since its previous ReqOutput (deltas), plus running totals."""

    rid: str
    new_token_ids: List[int]
    new_text: str
    finished: bool
    # upstream shape: {"type": "stop", "matched": int|str} | {"type": "length", "length": int}
    #                 | {"type": "abort", "message": str}
    finish_reason: Optional[Dict[str, Any]] = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    # per new token: logprob of the sampled token; and the top-k (token_id, logprob) pairs if asked
    new_token_logprobs: Optional[List[float]] = None
    new_top_logprobs: Optional[List[List[tuple]]] = None
    # an embedding server (--is-embedding): the request's pooled, L2-normalized vector (with finished=True)
    embedding: Optional[List[float]] = None
    # once, with the first output after the prefill: per prompt position from logprob_start_len (logprob|None,
    # token_id), the top-k pairs, the token_ids_logprob pairs; and per new token its token_ids_logprob pairs
    input_token_logprobs: Optional[List[tuple]] = None
    input_top_logprobs: Optional[List[Optional[List[tuple]]]] = None
    input_token_ids_logprobs: Optional[List[Optional[List[tuple]]]] = None
    new_token_ids_logprobs: Optional[List[List[tuple]]] = None
    # speculative decoding: verify steps in which the request had proposals (upstream's spec_verify_ct), and the
    # tokens it committed in those steps (spec_verify_tokens / spec_verify_ct = its acceptance length)
    spec_verify_ct: int = 0
    spec_verify_tokens: int = 0

    def __reduce__(self):
        # one per request per step crosses to the HTTP process: pickled as its field values, not a __dict__, it is
        # smaller and unpickles in a third of the time
        return ReqOutput, _req_output_fields(self)


_req_output_fields = operator.attrgetter(*(f.name for f in fields(ReqOutput)))


@dataclass
class BatchReqOutput:
    outputs: List[ReqOutput] = field(default_factory=list)


@dataclass
class AbortReq:
    rid: str
    message: str = "Request aborted"


@dataclass
class FlushCacheReq:
    pass


@dataclass
class GetInfoReq:
    """Ask the scheduler for its limits, memory plan and live stats; the reply is a dict."""

    pass


@dataclass
class RpcReply:
    kind: str
    payload: Any = None
    dp_rank: int = 0  # which --dp-size replica answered

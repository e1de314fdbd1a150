"""The one request builder of the native generate API, shared by `Engine.generate` and POST /generate.

    body dict -> parse_generate_request -> GenerateRequest (pydantic: every field rule of sampling/validation.py)
              -> build_generate_requests -> [TokenizedGenerateReqInput], one per prompt x n, in that order

Both steps are plain blocking code: the Engine calls them in-process, the server runs build_generate_requests on the
TokenizerManager's off-loop executor. A client mistake is a RequestError(400) whose message and param are the same
on both paths (the server answers it as an error body, the Engine raises it as ParamError, a ValueError).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List, Optional

from sglang.srt.entrypoints.openai.protocol import GenerateRequest, validate_request_body
from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.managers.request_error import RequestError
from sglang.srt.managers.request_logprob_fields import apply_logprob_fields
from sglang.srt.managers.request_tokenizer import RequestTokenizer
from sglang.srt.sampling.sampling_params import choice_sampling_params
from sglang.srt.sampling.validation import ParamError, check_token_ids_in_vocab

SAMPLING_PREFIX = "sampling_params."  # how both paths name a sampling parameter in messages and `param`


@dataclass
class GenerateBatch:
    reqs: List[TokenizedGenerateReqInput]  # prompt-major: prompt p's choices are reqs[p * n : (p + 1) * n]
    is_batch: bool  # answer with a list (a batch of prompts, or n > 1) rather than one object
    token_text: Optional[Callable[[int], str]] = None  # return_text_in_logprobs: a token id's text (its decode)


def parse_generate_request(data: Any) -> GenerateRequest:
    return validate_request_body(data, GenerateRequest)


def _as_list(value: Any, count: int, name: str) -> list:
    if isinstance(value, list):
        if len(value) != count:
            raise RequestError(400, f"{name} has {len(value)} entries but there are {count} prompts.", param=name)
        return value
    return [value] * count


def _prompts(req: GenerateRequest) -> tuple[list, bool]:
    if (req.text is None) == (req.input_ids is None):
        raise RequestError(400, "Send exactly one of text or input_ids.", param="text")
    if req.text is not None:
        is_batch = isinstance(req.text, list)
        prompts = [{"text": t} for t in (req.text if is_batch else [req.text])]
    else:
        is_batch = bool(req.input_ids) and isinstance(req.input_ids[0], list)
        prompts = [{"input_ids": ids} for ids in (req.input_ids if is_batch else [req.input_ids])]
    if is_batch and not prompts:
        raise RequestError(400, "The batch is empty.", param="text" if req.text is not None else "input_ids")
    return prompts, is_batch


def _sampling_dict(model: Any, vocab_size: int) -> dict:
    sp = model.model_dump(exclude_unset=True) if model is not None else {}
    try:  # the one rule pydantic cannot know: stop token ids against this model's vocabulary
        check_token_ids_in_vocab(sp.get("stop_token_ids") or [], vocab_size, "stop_token_ids")
    except ParamError as e:
        param = SAMPLING_PREFIX + e.param
        raise RequestError(400, e.render(param), param=param) from None
    return sp


def build_generate_requests(req: GenerateRequest, rt: RequestTokenizer) -> GenerateBatch:
    """Tokenize and check every prompt x n choice against the model's limits. Raises RequestError(400)."""
    prompts, is_batch = _prompts(req)
    params = _as_list(req.sampling_params, len(prompts), "sampling_params")
    rids = _as_list(req.rid, len(prompts), "rid") if isinstance(req.rid, list) else None
    images = req.image_data if is_batch and isinstance(req.image_data, list) else [req.image_data] * len(prompts)
    videos = req.video_data if is_batch and isinstance(req.video_data, list) else [req.video_data] * len(prompts)
    salts = _as_list(req.cache_salt, len(prompts), "cache_salt")
    audios = req.audio_data if is_batch and isinstance(req.audio_data, list) else [req.audio_data] * len(prompts)
    processors = _as_list(req.custom_logit_processor, len(prompts), "custom_logit_processor")
    reqs: List[TokenizedGenerateReqInput] = []
    for p, prompt in enumerate(prompts):
        sp = _sampling_dict(params[p], rt.vocab_size)
        n = sp.pop("n", 1)
        ids: Optional[List[int]] = prompt.get("input_ids")
        for i in range(n):
            rid = rids[p] if rids is not None else (req.rid if not is_batch and n == 1 else None)
            if rid is not None and n > 1:
                rid = f"{rid}-{i}"
            t = rt.tokenize_request(
                text=prompt.get("text"),
                input_ids=ids,
                sampling_params=choice_sampling_params(sp, i),
                rid=rid,
                stream=req.stream,
                return_logprob=req.return_logprob,
                top_logprobs_num=req.top_logprobs_num,
                image_data=images[p],
                video_data=videos[p],
                audio_data=audios[p],
                prompt_param="text" if req.text is not None else "input_ids",
                max_tokens_param="max_new_tokens",
                custom_logit_processor=processors[p],
            )
            apply_logprob_fields(t, req.logprob_start_len, req.token_ids_logprob, rt.vocab_size)
            t.cache_salt = salts[p]
            ids = t.input_ids if t.mm_inputs is None else prompt.get("input_ids")  # media: processed per choice
            reqs.append(t)
    seen = set()
    for t in reqs:
        if t.rid in seen:
            raise RequestError(400, f"Duplicate request id {t.rid!r}.", param="rid")
        seen.add(t.rid)
    return GenerateBatch(reqs, is_batch or len(reqs) > 1, _token_text(req, rt))


def _token_text(req: GenerateRequest, rt: RequestTokenizer) -> Optional[Callable[[int], str]]:
    """return_text_in_logprobs: the text of one token alone, as upstream fills the logprob entries' text slot."""
    if not req.return_text_in_logprobs:
        return None
    if rt.tokenizer is None:
        raise RequestError(400, "return_text_in_logprobs needs the tokenizer, and this server runs with "
                                "--skip-tokenizer-init; remove return_text_in_logprobs and decode the ids yourself.",
                           param="return_text_in_logprobs")
    tokenizer = rt.tokenizer
    return lambda token_id: tokenizer.decode([token_id])

"""POST /v1/completions: prompts (text or token ids, one or many) x n choices, streaming or not.

Choice index = prompt_index * n + sample_index, as OpenAI numbers them. Usage counts every prompt once and every
generated token of every choice; with --enable-cache-report, prompt_tokens_details.cached_tokens sums each prompt's
prefix-cache hit (its first choice's).
"""

from __future__ import annotations

from typing import AsyncIterator, List, Optional

from fastapi import Request
from fastapi.responses import Response

from sglang.srt.entrypoints.openai.protocol import CompletionRequest
from sglang.srt.entrypoints.openai.serving_base import (
    SSE_DONE,
    OpenAIServingBase,
    api_param_errors,
    api_param_names,
    check_sampling_params,
    finish_reason_str,
    grammar_param_names,
    json_response,
    matched_stop,
)
from sglang.srt.entrypoints.openai.sse_chunks import StreamChunks
from sglang.srt.entrypoints.openai.prompt_logprobs_format import join_blocks, legacy_prompt_block, vllm_prompt_logprobs
from sglang.srt.managers.io_struct import ReqOutput
from sglang.srt.managers.request_logprob_fields import apply_logprob_fields
from sglang.srt.managers.tokenizer_manager import RequestError
from sglang.srt.sampling.sampling_params import choice_sampling_params


class CompletionLogprobs:
    """Accumulates OpenAI's legacy logprobs block: tokens, token_logprobs, top_logprobs, text_offset."""

    def __init__(self, tokenizer_manager, start_offset: int, top_n: int = 5):
        self.tm = tokenizer_manager
        self.offset = start_offset
        self.top_n = top_n  # the request's logprobs (the server may have asked for more, for prompt_logprobs)

    def delta(self, out: ReqOutput) -> Optional[dict]:
        if out.new_token_logprobs is None:
            return None
        tokens = [self.tm.token_str(t) for t in out.new_token_ids]
        offsets = []
        for tok in tokens:
            offsets.append(self.offset)
            self.offset += len(tok)
        top = None
        if out.new_top_logprobs is not None and self.top_n:
            top = [{self.tm.token_str(tid): lp for tid, lp in pairs[:self.top_n]} for pairs in out.new_top_logprobs]
        return {"tokens": tokens, "token_logprobs": list(out.new_token_logprobs), "top_logprobs": top, "text_offset": offsets}


class OpenAIServingCompletion(OpenAIServingBase):
    object_prefix = "cmpl"
    request_model = CompletionRequest

    def prompts(self, req: CompletionRequest) -> List[dict]:
        """Normalise `prompt` into [{"text": str} | {"input_ids": [int]}]."""
        p = req.prompt
        if isinstance(p, str):
            return [{"text": p}]
        if not p:
            raise RequestError(400, "prompt must not be an empty list.", param="prompt")
        if isinstance(p[0], str):
            return [{"text": x} for x in p]
        if isinstance(p[0], int):
            return [{"input_ids": list(p)}]
        return [{"input_ids": list(x)} for x in p]

    async def create(self, req: CompletionRequest, raw_request: Request) -> Response:
        tm = self.tokenizer_manager
        prompts = self.prompts(req)
        base = req.sampling_params(req.max_tokens)
        names = grammar_param_names(req)  # the API's field names, for every 400 this request can get
        check_sampling_params({**base, "n": req.n}, tm.vocab_size,
                              {"min_new_tokens": "min_tokens", "max_new_tokens": "max_tokens", **names},
                              grammar_backend=tm.server_args.grammar_backend)
        rids = self.rids(req.rid, len(prompts) * req.n)
        tokenized, echo_texts = [], []
        for p_idx, prompt in enumerate(prompts):
            text, ids = prompt.get("text"), prompt.get("input_ids")
            for i in range(req.n):
                with api_param_names(names):
                    t = await tm.tokenize_request(
                        text=text,
                        input_ids=ids,  # tokenized once per prompt, then reused by its other choices
                        sampling_params=choice_sampling_params(base, i),
                        rid=rids[p_idx * req.n + i],
                        stream=req.stream,
                        return_logprob=req.logprobs is not None or req.prompt_logprobs is not None,
                        top_logprobs_num=max(req.logprobs or 0, req.prompt_logprobs or 0),
                        custom_logit_processor=req.custom_logit_processor,
                    )
                if (req.echo and req.logprobs is not None) or req.prompt_logprobs is not None:  # from the first token
                    apply_logprob_fields(t, 0, None, tm.vocab_size, start_param="prompt_logprobs",
                                         flag_param="logprobs")
                t.cache_salt = req.cache_salt
                ids = t.input_ids
                tokenized.append(t)
                if req.echo:
                    echo_texts.append(text if text is not None else await tm.decode(ids))
        prompt_tokens = sum(len(tokenized[p * req.n].input_ids) for p in range(len(prompts)))
        gen = api_param_errors(tm.generate_many(tokenized, raw_request), names)
        if req.stream:
            return await self.stream(req, gen, prompt_tokens, echo_texts, len(tokenized))
        return await self.complete(req, gen, prompt_tokens, echo_texts, len(tokenized))

    async def complete(self, req, gen, prompt_tokens, echo_texts, num_choices) -> Response:
        outs: List[Optional[ReqOutput]] = [None] * num_choices
        async for i, out in gen:
            outs[i] = out
        if any(o is None for o in outs):
            raise RequestError(499, "Client disconnected.")
        choices = []
        completion_tokens = cached = 0
        for i, out in enumerate(outs):
            prefix = echo_texts[i] if echo_texts else ""
            choices.append({
                "index": i,
                "text": prefix + out.new_text,
                "logprobs": self.logprobs_block(req, out, len(prefix), True),
                "finish_reason": finish_reason_str(out.finish_reason),
                "matched_stop": matched_stop(out.finish_reason),
                **self.prompt_logprobs_field(req, out),
            })
            completion_tokens += out.completion_tokens
        for p in range(0, num_choices, req.n):
            cached += outs[p].cached_tokens
        return json_response({
            "id": self.new_id(),
            "object": "text_completion",
            "created": self.created(),
            "model": self.response_model(req),
            "choices": choices,
            "usage": self.usage(prompt_tokens, completion_tokens, cached),
        })

    def logprobs_block(self, req, out: ReqOutput, start_offset: int, first: bool,
                       acc: Optional[CompletionLogprobs] = None) -> Optional[dict]:
        """The choice's legacy logprobs: with echo, the prompt's tokens first (prompt_logprobs_format.py)."""
        if req.logprobs is None:
            return None
        acc = acc or CompletionLogprobs(self.tokenizer_manager, start_offset, req.logprobs)
        gen = acc.delta(out)
        if req.echo and first:
            return join_blocks(legacy_prompt_block(self.tokenizer_manager, out, req.logprobs), gen)
        return gen

    def prompt_logprobs_field(self, req, out: ReqOutput) -> dict:
        if req.prompt_logprobs is None or out.input_token_logprobs is None:
            return {}
        return {"prompt_logprobs": vllm_prompt_logprobs(self.tokenizer_manager, out, req.prompt_logprobs)}

    async def stream(self, req, gen: AsyncIterator, prompt_tokens: int, echo_texts: List[str],
                     num_choices: int) -> Response:
        try:
            first = await self.first_item(gen)
        except RequestError:
            await gen.aclose()
            raise
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        chunks = StreamChunks(self.new_id(), "text_completion", self.created(), self.response_model(req),
                              include_usage)
        logprob_state = {}

        def chunk(i: int, out: ReqOutput, first_of_choice: bool) -> bytes:
            text = out.new_text
            if first_of_choice and echo_texts:
                text = echo_texts[i] + text
            if req.logprobs is None and not out.finished and out.input_token_logprobs is None:
                return chunks.completion_text(i, text)  # the chunk of almost every token
            logprobs = None
            if req.logprobs is not None:
                start = len(echo_texts[i]) if echo_texts else 0
                lp = logprob_state.setdefault(i, CompletionLogprobs(self.tokenizer_manager, start, req.logprobs))
                logprobs = self.logprobs_block(req, out, start, first_of_choice, lp)
            return chunks.choice({
                "index": i,
                "text": text,
                "logprobs": logprobs,
                "finish_reason": finish_reason_str(out.finish_reason) if out.finished else None,
                "matched_stop": matched_stop(out.finish_reason) if out.finished else None,
                **self.prompt_logprobs_field(req, out),
            })

        def usage() -> bytes:
            cached_total = sum(v for k, v in cached.items() if k % req.n == 0)
            return chunks.usage(self.usage(prompt_tokens, sum(completion_tokens.values()), cached_total))

        completion_tokens: dict = {}
        cached: dict = {}

        async def events() -> AsyncIterator[bytes]:
            """One write per output; after the last choice's finish the usage chunk and [DONE] go with it."""
            seen = set()
            num_finished = 0
            item = first
            while item is not None:
                i, out = item
                parts = []
                if out.new_text or out.finished or i not in seen or (req.logprobs is not None and out.new_token_ids):
                    parts.append(chunk(i, out, i not in seen))
                    seen.add(i)
                completion_tokens[i] = out.completion_tokens
                cached[i] = out.cached_tokens
                num_finished += out.finished
                if num_finished == num_choices:  # nothing follows but the usage and [DONE]
                    if include_usage:
                        parts.append(usage())
                    parts.append(SSE_DONE)
                if parts:
                    yield b"".join(parts)
                item = await self.first_item(gen)
            if num_finished != num_choices and include_usage:
                yield usage()

        return self.stream_response(gen, events())

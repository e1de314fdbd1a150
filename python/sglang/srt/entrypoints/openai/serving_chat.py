"""POST /v1/chat/completions: the model's chat template, n choices, streaming or not, logprobs, usage, tool calls
and reasoning.

Streaming follows OpenAI's chunk sequence per choice: a first delta carrying the role, content deltas, then an
empty delta with finish_reason; with stream_options.include_usage every chunk has "usage": null and one last chunk
with no choices carries the usage. With --reasoning-parser / --tool-call-parser each choice's text goes through a
ChatOutputParser (srt/parser/chat_output.py): deltas then carry reasoning_content and tool_calls too, and a reply
that ends in calls finishes with "tool_calls".

As upstream, every message and every delta has `reasoning_content` (null when there is none), with or without a
parser, so clients may read it as an attribute; usage counts the reasoning tokens (srt/parser/reasoning_tokens.py)
and reports prefix-cache hits only with --enable-cache-report; `model` echoes the request's.
"""

from __future__ import annotations

from typing import AsyncIterator, List, Optional

from fastapi import Request
from fastapi.responses import Response

from sglang.srt.entrypoints.openai.prompt_logprobs_format import vllm_prompt_logprobs
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
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
from sglang.srt.function_call.tool_call_stream import ToolCallStream
from sglang.srt.function_call.tool_plan import ToolPlan, plan_tools, template_tool_calls
from sglang.srt.managers.io_struct import ReqOutput
from sglang.srt.managers.request_logprob_fields import apply_logprob_fields
from sglang.srt.managers.tokenizer_manager import RequestError
from sglang.srt.parser.chat_output import ChatOutputParser, finish_reason_with_calls
from sglang.srt.parser.reasoning_parser import ReasoningParser
from sglang.srt.parser.reasoning_tokens import count_reasoning_tokens
from sglang.srt.sampling.sampling_params import choice_sampling_params

# roles the common chat templates know; OpenAI's newer "developer" role is the old "system"
ROLE_ALIASES = {"developer": "system"}


class OpenAIServingChat(OpenAIServingBase):
    object_prefix = "chatcmpl"
    request_model = ChatCompletionRequest

    def template_messages(self, req: ChatCompletionRequest) -> tuple[List[dict], List[str], List[str], list]:
        messages, images, videos, audios = [], [], [], []
        holders = self.tokenizer_manager.mm_placeholders
        for m in req.messages:
            msg = {"role": ROLE_ALIASES.get(m.role, m.role),
                   "content": m.text(holders.get("image"), holders.get("video"), holders.get("audio"))}
            if m.name is not None:
                msg["name"] = m.name
            if m.tool_calls is not None:
                msg["tool_calls"] = template_tool_calls(m.tool_calls)
            if m.tool_call_id is not None:
                msg["tool_call_id"] = m.tool_call_id
            if m.reasoning_content is not None:  # templates that show earlier thoughts (Qwen3) read it
                msg["reasoning_content"] = m.reasoning_content
            messages.append(msg)
            images.extend(m.image_urls())
            videos.extend(m.video_urls())
            audios.extend(m.audios())
        return messages, images, videos, audios

    def logprobs_content(self, out: ReqOutput, top_n: Optional[int] = None) -> Optional[List[dict]]:
        if out.new_token_logprobs is None:
            return None
        tm = self.tokenizer_manager
        content = []
        for j, (tid, lp) in enumerate(zip(out.new_token_ids, out.new_token_logprobs)):
            tok = tm.token_str(tid)
            top = []
            if out.new_top_logprobs is not None and j < len(out.new_top_logprobs):
                for t2, lp2 in out.new_top_logprobs[j][:top_n]:
                    s2 = tm.token_str(t2)
                    top.append({"token": s2, "logprob": lp2, "bytes": list(s2.encode())})
            content.append({"token": tok, "logprob": lp, "bytes": list(tok.encode()), "top_logprobs": top})
        return content

    def tool_plan(self, req: ChatCompletionRequest) -> ToolPlan:
        """Runs off the event loop: a forced choice turns every function's schema into grammar text."""
        tm, args = self.tokenizer_manager, self.tokenizer_manager.server_args
        special = getattr(tm.tokenizer, "all_special_tokens", None) or ()
        plan = plan_tools(req.tools, req.tool_choice, req.parallel_tool_calls, args.tool_call_parser, special,
                          getattr(args, "grammar_backend", None))
        if plan.ebnf is not None and req.constraint():
            raise RequestError(400, "tool_choice 'required' or a named function is enforced with a grammar, and "
                               "response_format / json_schema / regex / ebnf already constrains this request's "
                               "output; use one or the other.", param="tool_choice")
        return plan

    def reasoning_parser_name(self, req: ChatCompletionRequest, plan: ToolPlan) -> Optional[str]:
        """--reasoning-parser, unless the request turned thinking off or forces a call (no room for thoughts)."""
        name = self.tokenizer_manager.server_args.reasoning_parser
        thinking = (req.chat_template_kwargs or {}).get("enable_thinking", True) is not False
        return name if name and thinking and not plan.forced else None

    def reasoning_tokens(self, req: ChatCompletionRequest, plan: ToolPlan, token_ids: List[int]) -> int:
        """How many of one choice's output tokens are reasoning (counted whether or not separate_reasoning moves
        the text, as upstream's scheduler counts them); 0 without a parser."""
        name = self.reasoning_parser_name(req, plan)
        if name is None:
            return 0
        tok = self.tokenizer_manager.tokenizer
        return count_reasoning_tokens(name, token_ids, lambda ids: tok.decode(
            ids, skip_special_tokens=req.skip_special_tokens))

    def output_parser(self, req: ChatCompletionRequest, plan: ToolPlan) -> ChatOutputParser:
        """A fresh parser for one choice's output."""
        name = self.reasoning_parser_name(req, plan)
        reasoning = ReasoningParser(name) if name and req.separate_reasoning else None
        tools = ToolCallStream(plan.detector, plan.function_names, plan.forced) if plan.detector else None
        return ChatOutputParser(reasoning, tools, stream_reasoning=req.stream_reasoning)

    async def create(self, req: ChatCompletionRequest, raw_request: Request) -> Response:
        tm = self.tokenizer_manager
        plan = await tm.offloop.run(self.tool_plan, req) if req.tools else self.tool_plan(req)
        base = req.sampling_params(req.max_output_tokens)
        if plan.ebnf is not None:
            base["ebnf"] = plan.ebnf
        names = grammar_param_names(req)  # the API's field names, for every 400 this request can get
        check_sampling_params({**base, "n": req.n}, tm.vocab_size,
                              {"min_new_tokens": "min_tokens", "max_new_tokens": req.max_tokens_param, **names},
                              grammar_backend=tm.server_args.grammar_backend)
        messages, images, videos, audios = self.template_messages(req)
        prompt = await tm.apply_chat_template(
            messages,
            tools=plan.template_tools,
            continue_final_message=req.continue_final_message,
            template_kwargs=req.chat_template_kwargs,
        )
        rids = self.rids(req.rid, req.n)
        tokenized, ids = [], None
        for i in range(req.n):  # with media, each choice is tokenized and processed again
            with api_param_names(names):
                t = await tm.tokenize_request(
                    text=prompt,
                    input_ids=None if images or videos or audios else ids,
                    sampling_params=choice_sampling_params(base, i),
                    rid=rids[i],
                    stream=req.stream,
                    return_logprob=req.logprobs or req.prompt_logprobs is not None,
                    top_logprobs_num=max(req.top_logprobs or 0, req.prompt_logprobs or 0),
                    image_data=images or None,
                    video_data=videos or None,
                    audio_data=audios or None,
                    add_special_tokens=False,  # the template already spells out the special tokens
                    prompt_param="messages",
                    max_tokens_param="max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens",
                    custom_logit_processor=req.custom_logit_processor,
                )
            if req.prompt_logprobs is not None:  # vLLM's extension: every prompt token (the template's too)
                apply_logprob_fields(t, 0, None, tm.vocab_size, start_param="prompt_logprobs",
                                     flag_param="logprobs")
            t.cache_salt = req.cache_salt
            ids = t.input_ids
            tokenized.append(t)
        gen = api_param_errors(tm.generate_many(tokenized, raw_request), names)
        if req.stream:
            return await self.stream(req, gen, len(ids), plan)
        return await self.complete(req, gen, len(ids), plan)

    async def complete(self, req: ChatCompletionRequest, gen, prompt_tokens: int, plan: ToolPlan) -> Response:
        outs: List[Optional[ReqOutput]] = [None] * req.n
        async for i, out in gen:
            outs[i] = out
        if any(o is None for o in outs):
            raise RequestError(499, "Client disconnected.")
        choices = []
        for i, out in enumerate(outs):
            parser = self.output_parser(req, plan)
            choices.append({
                "index": i,
                "message": parser.message(out.new_text),
                "logprobs": {"content": self.logprobs_content(out, req.top_logprobs or 0)} if req.logprobs else None,
                "finish_reason": finish_reason_with_calls(finish_reason_str(out.finish_reason), parser),
                "matched_stop": matched_stop(out.finish_reason),
            })
        return json_response({
            "id": self.new_id(),
            "object": "chat.completion",
            "created": self.created(),
            "model": self.response_model(req),
            "choices": choices,
            "usage": self.usage(prompt_tokens, sum(o.completion_tokens for o in outs), outs[0].cached_tokens,
                                sum(self.reasoning_tokens(req, plan, o.new_token_ids) for o in outs)),
            **({"prompt_logprobs": vllm_prompt_logprobs(self.tokenizer_manager, outs[0], req.prompt_logprobs)}
               if req.prompt_logprobs is not None else {}),
        })

    async def stream(
        self, req: ChatCompletionRequest, gen: AsyncIterator, prompt_tokens: int, plan: ToolPlan
    ) -> Response:
        try:
            first = await self.first_item(gen)
        except RequestError:
            await gen.aclose()
            raise
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        chunks = StreamChunks(self.new_id(), "chat.completion.chunk", self.created(), self.response_model(req),
                              include_usage)
        count_reasoning = self.reasoning_parser_name(req, plan) is not None
        output_ids: dict = {}  # choice -> its token ids so far, to count its reasoning tokens at the end

        def chunk(i: int, delta: dict, finish_reason=None, logprobs=None, matched=None) -> bytes:
            if finish_reason is None and logprobs is None and len(delta) == 1 and "content" in delta:
                return chunks.chat_content(i, delta["content"])  # the chunk of almost every token
            # every delta carries reasoning_content (null when it has none), as upstream's do
            delta = {**delta, "reasoning_content": delta.get("reasoning_content")}
            choice = {"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
            if finish_reason is not None:
                choice["matched_stop"] = matched
            return chunks.choice(choice)

        async def events() -> AsyncIterator[bytes]:
            """One write per output: all the chunks of one merged delta go out together, and after the last
            choice's finish the usage chunk and [DONE] go with it."""
            completion_tokens, cached = {}, 0
            parsers = {}
            num_finished = 0
            item = first
            while item is not None:
                i, out = item
                parts = []
                if i not in parsers:
                    parsers[i] = self.output_parser(req, plan)
                    parts.append(chunk(i, {"role": "assistant", "content": ""}))
                if not parsers[i].active and not req.logprobs:  # plain text: the delta is the text (parser.feed)
                    if out.new_text:
                        parts.append(chunks.chat_content(i, out.new_text))
                    deltas = ()
                else:
                    deltas = parsers[i].feed(out.new_text, out.finished)
                if not deltas and req.logprobs and out.new_token_ids:
                    deltas = [{"content": ""}]  # the logprobs still go out with this step
                for k, delta in enumerate(deltas):
                    lp = {"content": self.logprobs_content(out)} if req.logprobs and k == 0 else None
                    parts.append(chunk(i, delta, logprobs=lp))
                if out.finished:
                    reason = finish_reason_with_calls(finish_reason_str(out.finish_reason), parsers[i])
                    parts.append(chunk(i, {}, reason, matched=matched_stop(out.finish_reason)))
                    num_finished += 1
                completion_tokens[i] = out.completion_tokens
                if count_reasoning:
                    output_ids.setdefault(i, []).extend(out.new_token_ids)
                if i == 0:
                    cached = out.cached_tokens
                if num_finished == req.n:  # nothing follows but the usage and [DONE]
                    if include_usage:
                        parts.append(usage_chunk(completion_tokens, cached))
                    parts.append(SSE_DONE)
                if parts:
                    yield b"".join(parts)
                item = await self.first_item(gen)
            if num_finished < req.n and include_usage:  # the outputs ended without every finish
                yield usage_chunk(completion_tokens, cached)

        def usage_chunk(completion_tokens: dict, cached: int) -> bytes:
            reasoning = sum(self.reasoning_tokens(req, plan, ids) for ids in output_ids.values())
            return chunks.usage(self.usage(prompt_tokens, sum(completion_tokens.values()), cached, reasoning))

        return self.stream_response(gen, events())

"""The offline engine: `sglang.Engine(**server_args).generate(prompts, sampling_params)`.

The scheduler runs in this process (no IPC on the offline path); generate() tokenizes, queues the requests and
steps the scheduler until they finish. Requests are built and checked by the builder of POST /generate
(generate_builder.py) and answered by its accumulator (managers/generate_output.py): same fields, same logprob
format ([logprob, token_id, None]), and a bad input is a ParamError (a ValueError) with the server's message.
A request that a fault failed inside the scheduler comes back like any other, with finish_reason
{"type": "abort", "message": "The <step> step failed ...", "status_code": 500} and the tokens it had produced;
the other requests and later generate() calls are unaffected. Bad input raises ValueError before anything runs.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Dict, Iterator, List, Optional, Union

from sglang.srt.entrypoints.generate_builder import GenerateBatch, build_generate_requests, parse_generate_request
from sglang.srt.entrypoints.serving_generate import check_require_reasoning
from sglang.srt.managers.request_kind import check_request_kind
from sglang.srt.managers.generate_output import GenerateAccumulator
from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.managers.request_error import RequestError
from sglang.srt.managers.request_tokenizer import RequestTokenizer
from sglang.srt.sampling.validation import ParamError
from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="[%(asctime)s] %(levelname)s %(name)s: %(message)s")


class Engine:
    def __init__(self, server_args: Optional[ServerArgs] = None, **kwargs):
        from sglang.srt.launch.tp_ranks import start_engine_ranks
        from sglang.srt.managers.scheduler import Scheduler

        self.server_args = server_args or ServerArgs(**kwargs)
        if self.server_args.dp_size > 1:
            raise ValueError(f"dp_size={self.server_args.dp_size}: sglang.Engine runs one replica in this process; "
                             "serve data parallelism with `sglang serve --dp-size N` (or several servers behind "
                             "sglang-router, docs/router.md).")
        configure_logging(self.server_args.log_level)
        # --tp-size N: this process is rank 0, the other ranks are child processes (srt/launch/tp_ranks.py)
        self.server_args, self.tp_ranks = start_engine_ranks(self.server_args)
        try:
            self.scheduler = Scheduler(self.server_args)
            if not self.server_args.skip_server_warmup:
                self.scheduler.warmup()
        except BaseException:
            if self.tp_ranks is not None:
                self.tp_ranks.stop()
            raise
        self.tokenizer = self.scheduler.tokenizer
        s = self.scheduler
        self.request_tokenizer = RequestTokenizer(
            self.tokenizer, getattr(s.model_runner, "mm_processor", None), s.model_config.vocab_size, s.context_len,
            s.max_req_len, s.max_req_len - 1, grammar_backend=self.server_args.grammar_backend,
            enable_custom_logit_processor=self.server_args.enable_custom_logit_processor)

    # ------------------------------------------------------------------ requests
    def _build(self, body: dict) -> GenerateBatch:
        """The server's builder on the same body; its RequestError becomes a ParamError (a ValueError) with the
        message and param /generate would answer."""
        try:
            req = parse_generate_request(body)
            if req.require_reasoning:
                check_require_reasoning(req, self.server_args.reasoning_parser)
            return build_generate_requests(req, self.request_tokenizer)
        except RequestError as e:
            raise ParamError(e.param, "", message=e.message) from None

    def _check_kind(self, embedding: bool) -> None:
        """generate() on an --is-embedding engine, encode() on a generative one: a ParamError saying what to do."""
        try:
            check_request_kind(embedding, self.server_args.is_embedding)
        except RequestError as e:
            raise ParamError(None, "", message=e.message) from None

    def _submit(self, reqs: List[TokenizedGenerateReqInput]) -> None:
        added = []
        try:
            for r in reqs:
                self.scheduler.add_request(r)
                added.append(r.rid)
        except Exception:
            for rid in added:
                self.scheduler.abort_request(rid)
            self.scheduler.step()  # drain the abort outputs
            raise

    def generate(
        self,
        prompt: Optional[Union[str, List[str]]] = None,
        sampling_params: Optional[Union[Dict[str, Any], List[Dict[str, Any]]]] = None,
        input_ids: Optional[Union[List[int], List[List[int]]]] = None,
        image_data: Optional[Any] = None,
        return_logprob: bool = False,
        top_logprobs_num: int = 0,
        stream: bool = False,
        rid: Optional[Union[str, List[str]]] = None,
        video_data: Optional[Any] = None,
        audio_data: Optional[Any] = None,
        logprob_start_len: Optional[int] = None,
        token_ids_logprob: Optional[List[int]] = None,
        custom_logit_processor: Optional[str] = None,
        return_text_in_logprobs: Optional[bool] = None,
        cache_salt: Optional[Union[str, List[str]]] = None,
        require_reasoning: Optional[bool] = None,
    ):
        """POST /generate in-process: the same body fields (`prompt` is its `text`), the same checks and messages,
        the same response objects (see generate_output.py). A stream yields cumulative objects, like the server's."""
        body = {"text": prompt, "input_ids": input_ids, "sampling_params": sampling_params, "image_data": image_data,
                "video_data": video_data, "audio_data": audio_data, "return_logprob": return_logprob,
                "top_logprobs_num": top_logprobs_num, "stream": stream, "rid": rid,
                "logprob_start_len": logprob_start_len, "token_ids_logprob": token_ids_logprob,
                "custom_logit_processor": custom_logit_processor,
                "return_text_in_logprobs": return_text_in_logprobs, "cache_salt": cache_salt,
                "require_reasoning": require_reasoning}
        self._check_kind(embedding=False)
        batch = self._build({k: val for k, val in body.items() if val is not None})
        if stream and batch.is_batch:
            raise ParamError("stream", "", message="Streaming is supported for a single prompt with n=1.")
        self._submit(batch.reqs)
        start = time.perf_counter()
        spec = self.server_args.speculative_algorithm is not None
        accs = [GenerateAccumulator(r.rid, return_logprob, start, batch.token_text, spec) for r in batch.reqs]
        if stream:
            return self._stream(accs[0])
        self._run_to_completion(accs)
        results = [a.response() for a in accs]
        return results if batch.is_batch else results[0]

    def encode(self, prompt: Union[str, List[str], List[int], List[List[int]]]):
        """Embeddings of an --is-embedding engine, like upstream's Engine.encode: `prompt` in any of POST
        /v1/embeddings' input shapes (text, texts, token ids, lists of token ids); per input {"embedding": [floats,
        L2-normalized], "meta_info": {"prompt_tokens": n, "finish_reason": ...}}, a list for a batch."""
        from sglang.srt.entrypoints.embedding_inputs import build_embedding_requests, embedding_items, embedding_of

        self._check_kind(embedding=True)
        try:
            items = embedding_items(prompt, param="prompt")
            reqs = build_embedding_requests(items, self.request_tokenizer, param="prompt")
        except RequestError as e:
            raise ParamError(e.param, "", message=e.message) from None
        self._submit(reqs)
        outs: Dict[str, Any] = {}
        pending = {r.rid for r in reqs}
        while pending:
            for out in self.scheduler.step():
                if out.rid in pending and out.finished:
                    outs[out.rid] = out
                    pending.discard(out.rid)
            if pending and not self.scheduler.has_work():
                raise RuntimeError(f"scheduler went idle with unfinished requests: {sorted(pending)}")
        results = [{"embedding": embedding_of(outs[r.rid]),
                    "meta_info": {"id": r.rid, "prompt_tokens": outs[r.rid].prompt_tokens,
                                  "finish_reason": outs[r.rid].finish_reason}} for r in reqs]
        is_batch = isinstance(prompt, list) and not isinstance(prompt[0], int)  # a token-id list is one input
        return results if is_batch else results[0]

    def _run_to_completion(self, accs: List[GenerateAccumulator]) -> None:
        by_rid = {a.rid: a for a in accs}
        pending = set(by_rid)
        while pending:
            for out in self.scheduler.step():
                acc = by_rid.get(out.rid)
                if acc is None:
                    continue
                acc.add(out)
                if out.finished:
                    pending.discard(out.rid)
            if pending and not self.scheduler.has_work():
                raise RuntimeError(f"scheduler went idle with unfinished requests: {sorted(pending)}")

    def _stream(self, acc: GenerateAccumulator) -> Iterator[dict]:
        try:
            while not acc.finished:
                for out in self.scheduler.step():
                    if out.rid == acc.rid:
                        acc.add(out)
                        yield acc.response()
        finally:
            if not acc.finished:
                self.scheduler.abort_request(acc.rid)
                self.scheduler.step()

    # ------------------------------------------------------------------ control
    def flush_cache(self) -> bool:
        return self.scheduler.flush_cache()

    def get_server_info(self) -> dict:
        info = self.scheduler.get_server_info()
        info["server_args"] = self.server_args.to_dict()
        return info

    def shutdown(self) -> None:
        for rid in list(self.scheduler.reqs):
            self.scheduler.abort_request(rid)
        self.scheduler.step()
        if self.tp_ranks is not None:
            self.tp_ranks.expect_exits()  # released below: they leave their loop and exit
            self.scheduler.model_runner.shutdown_tp()
            self.tp_ranks.stop()
        self.scheduler = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.scheduler is not None:
            self.shutdown()


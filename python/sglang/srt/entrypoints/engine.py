"""The offline engine: `sglang.Engine(**server_args).generate(prompts, sampling_params)`.

The scheduler runs in this process (no IPC on the offline path); generate() tokenizes, queues the requests and
steps the scheduler until they finish. Outputs follow upstream's shape:
    {"text": str, "output_ids": [int], "meta_info": {"id", "finish_reason", "prompt_tokens",
     "completion_tokens", "cached_tokens", ["output_token_logprobs", "output_top_logprobs"]}}
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Iterator, List, Optional, Union

from sglang.srt.managers.io_struct import ReqOutput, TokenizedGenerateReqInput, new_rid
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="[%(asctime)s] %(levelname)s %(name)s: %(message)s")


class Engine:
    def __init__(self, server_args: Optional[ServerArgs] = None, **kwargs):
        from sglang.srt.managers.scheduler import Scheduler

        self.server_args = server_args or ServerArgs(**kwargs)
        configure_logging(self.server_args.log_level)
        self.scheduler = Scheduler(self.server_args)
        self.scheduler.warmup()
        self.tokenizer = self.scheduler.tokenizer

    # ------------------------------------------------------------------ requests
    def _tokenize(self, prompt: Optional[str], input_ids: Optional[List[int]]) -> List[int]:
        if input_ids is not None:
            return list(input_ids)
        if prompt is None:
            raise ValueError("Either prompt or input_ids must be given.")
        if not isinstance(prompt, str):
            raise ValueError(f"prompt must be a string, got {type(prompt).__name__}.")
        if self.tokenizer is None:
            raise ValueError("The tokenizer is not loaded (skip_tokenizer_init); pass input_ids.")
        return self.tokenizer.encode(prompt)

    def _build_requests(self, prompt, sampling_params, input_ids, return_logprob, top_logprobs_num, stream,
                        image_data) -> tuple[List[TokenizedGenerateReqInput], bool]:
        single = not (isinstance(prompt, list) or (input_ids is not None and input_ids and isinstance(input_ids[0], list)))
        prompts = [prompt] if single else (prompt if prompt is not None else [None] * len(input_ids))
        ids_list = [input_ids] if single else (input_ids if input_ids is not None else [None] * len(prompts))
        if isinstance(sampling_params, list):
            if len(sampling_params) != len(prompts):
                raise ValueError("sampling_params list must have one entry per prompt.")
            sp_list = sampling_params
        else:
            sp_list = [sampling_params] * len(prompts)
        images = image_data if (isinstance(image_data, list) and not single) else [image_data] * len(prompts)
        reqs = []
        for p, ids, sp_dict, img in zip(prompts, ids_list, sp_list, images):
            sp = SamplingParams.from_dict(sp_dict)
            toks = self._tokenize(p, ids)
            mm = self._process_images(p, toks, img) if img is not None else None
            if mm is not None:
                toks = mm.input_ids
            for _ in range(sp.n):
                sp_i = SamplingParams.from_dict(sp_dict)
                reqs.append(TokenizedGenerateReqInput(
                    rid=new_rid(), input_text=p, input_ids=toks, sampling_params=sp_i, stream=stream,
                    return_logprob=return_logprob, top_logprobs_num=top_logprobs_num, mm_inputs=mm,
                ))
        return reqs, single and len(reqs) == 1

    def _process_images(self, prompt, input_ids, image_data):
        processor = getattr(self.scheduler.model_runner, "mm_processor", None)
        if processor is None:
            raise ValueError("This model does not accept images.")
        return processor.process(input_ids, image_data)

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
    ):
        reqs, single = self._build_requests(prompt, sampling_params, input_ids, return_logprob, top_logprobs_num,
                                            stream, image_data)
        self._submit(reqs)
        if stream:
            if not single:
                raise ValueError("Streaming is supported for a single prompt.")
            return self._stream(reqs[0].rid)
        results = self._run_to_completion([r.rid for r in reqs])
        return results[0] if single else results

    def _run_to_completion(self, rids: List[str]) -> List[dict]:
        acc: Dict[str, dict] = {rid: _empty_result(rid) for rid in rids}
        pending = set(rids)
        while pending:
            for out in self.scheduler.step():
                res = acc.get(out.rid)
                if res is None:
                    continue
                _accumulate(res, out)
                if out.finished:
                    pending.discard(out.rid)
            if pending and not self.scheduler.has_work():
                raise RuntimeError(f"scheduler went idle with unfinished requests: {sorted(pending)}")
        return [acc[rid] for rid in rids]

    def _stream(self, rid: str) -> Iterator[dict]:
        finished = False
        try:
            while not finished:
                for out in self.scheduler.step():
                    if out.rid != rid:
                        continue
                    chunk = _accumulate(_empty_result(rid), out)
                    finished = out.finished
                    yield chunk
        finally:
            if not finished:
                self.scheduler.abort_request(rid)
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
        self.scheduler = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.scheduler is not None:
            self.shutdown()


def _empty_result(rid: str) -> dict:
    return {"text": "", "output_ids": [], "meta_info": {"id": rid, "finish_reason": None}}


def _accumulate(res: dict, out: ReqOutput) -> dict:
    res["text"] += out.new_text
    res["output_ids"].extend(out.new_token_ids)
    meta = res["meta_info"]
    meta.update(finish_reason=out.finish_reason, prompt_tokens=out.prompt_tokens,
                completion_tokens=out.completion_tokens, cached_tokens=out.cached_tokens)
    if out.new_token_logprobs is not None:
        meta.setdefault("output_token_logprobs", []).extend(
            zip(out.new_token_logprobs, out.new_token_ids))
    if out.new_top_logprobs is not None:
        meta.setdefault("output_top_logprobs", []).extend(out.new_top_logprobs)
    return res

"""Req: one request's state inside the scheduler.

Token bookkeeping of a request (all counts in tokens):
    fill_ids = origin_input_ids + output_ids      everything the model has seen or produced
    kv_len                                        leading tokens of fill_ids whose KV sits in the pool,
                                                  recorded in req_to_token[req_pool_idx, :kv_len]
    prefix_len <= kv_len                          leading slots borrowed from the radix cache (locked at last_node);
                                                  slots [prefix_len, alloc_len) are owned by this request
    kv_len <= alloc_len                           leading tokens with a slot recorded in req_to_token; between
                                                  steps alloc_len == kv_len, inside a step the batch's new tokens
                                                  have slots (alloc_len) before the forward computes them (kv_len)
While decoding, kv_len == len(fill_ids) - 1: the last sampled token has no KV yet and is the next input.
A model with windowed layers (mem_cache/swa_pool.py) also keeps
    windowed_freed_len                            positions [prefix_len, windowed_freed_len) of the request's own
                                                  pages have had their windowed pages freed (the window moved past
                                                  them; managers/req_memory.py free_out_of_window); page-aligned
    window_released                               the borrowed prefix's window lock was dropped (the request's own
                                                  tokens cover its window now: mem_cache/swa_radix_cache.py)
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import regex
import torch

from sglang.srt.managers.incremental_detokenizer import (
    STOP_REGEX_SEARCH_TIMEOUT_S,
    IncrementalDetokenizer,
    find_stop,
    find_stop_regex,
    held_back_len,
    regex_held_back_len,
)
from sglang.srt.sampling.sampling_params import SamplingParams


class Req:
    # an embedding server (--is-embedding, managers/embedding_output.py): the running sum of a mean-pooled prompt's
    # chunks, then the normalized vector
    pooled_sum = None
    embedding = None
    custom_logit_processor = None  # a client-sent processor string (sampling/custom_logit_processor.py)
    # speculative decoding (managers/spec_decode.py): verify steps in which this request had proposals, and the
    # tokens it committed in them (its acceptance length = spec_verify_tokens / spec_verify_ct)
    spec_verify_ct = 0
    spec_verify_tokens = 0

    def __init__(self, rid: str, input_ids: List[int], sampling_params: SamplingParams, tokenizer=None,
                 stream: bool = False, return_logprob: bool = False, top_logprobs_num: int = 0,
                 eos_token_ids: Optional[set] = None, mm_inputs: Any = None):
        self.rid = rid
        self.origin_input_ids = list(input_ids)
        self.output_ids: List[int] = []
        self.sampling_params = sampling_params
        self.stream = stream
        self.return_logprob = return_logprob
        self.top_logprobs_num = top_logprobs_num
        self.mm_inputs = mm_inputs
        # M-RoPE models: the position of sequence token i >= len(prompt) is i + mrope_delta (0 otherwise)
        self.mrope_delta = getattr(mm_inputs, "mrope_position_delta", 0) if self.uses_mrope else 0
        self.stop_token_ids = set(sampling_params.stop_token_ids or [])
        if not sampling_params.ignore_eos and eos_token_ids:
            self.stop_token_ids |= set(eos_token_ids)
        self.max_new_tokens = sampling_params.max_new_tokens
        # stop_regex, compiled (validated at the edge: sampling/validation.check_stop_regex)
        self.stop_regexes = [regex.compile(p) for p in sampling_params.stop_regex_strs]
        # upstream's cache_salt: the radix cache namespace of this request's KV (None: the shared, unsalted one)
        self.cache_salt: Optional[str] = None

        # memory state
        self.req_pool_idx: Optional[int] = None
        self.kv_len = 0
        self.alloc_len = 0
        self.prefix_len = 0
        self.windowed_freed_len = 0
        self.window_released = False
        self.last_node = None
        self.cached_tokens = 0  # prompt tokens served from the prefix cache (first admission)
        self.num_retractions = 0

        # output state
        self.finished_reason: Optional[Dict[str, Any]] = None
        self.detok = (IncrementalDetokenizer(tokenizer, sampling_params.skip_special_tokens,
                                             sampling_params.spaces_between_special_tokens)
                      if tokenizer is not None else None)
        self.output_text = ""  # confirmed text (stop strings trimmed)
        self.sent_text_len = 0
        self.sent_token_len = 0
        self.output_token_logprobs: List[float] = []
        self.output_top_logprobs: List[List[tuple]] = []
        # upstream's logprob_start_len / token_ids_logprob (managers/prompt_logprob_state.py); None when not asked
        self.prompt_logprobs = None
        self.token_ids_logprob: Optional[List[int]] = None
        self.output_token_ids_logprobs: List[List[tuple]] = []
        self.generator: Optional[torch.Generator] = None
        # structured output: the matcher (constrained/request_grammar.py), set once the grammar has compiled
        self.grammar = None
        if sampling_params.seed is not None:
            self.generator = torch.Generator().manual_seed(sampling_params.seed)

    @property
    def uses_mrope(self) -> bool:
        """The request's positions are three-axis (a prompt position table from the processor)."""
        return getattr(self.mm_inputs, "mrope_positions", None) is not None

    # ------------------------------------------------------------------ shapes
    @property
    def fill_len(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    @property
    def fill_ids(self) -> List[int]:
        return self.origin_input_ids + self.output_ids

    @property
    def extend_len(self) -> int:
        """Tokens still to prefill before this request can decode."""
        return self.fill_len - self.kv_len

    def remaining_new_tokens(self) -> int:
        return self.max_new_tokens - len(self.output_ids)

    def finished(self) -> bool:
        return self.finished_reason is not None

    # ------------------------------------------------------------------ progress
    def append_token(self, token_id: int) -> None:
        self.append_token_id(token_id)
        self.add_token_text(len(self.output_ids))

    def append_token_id(self, token_id: int) -> None:
        """The token-level half of append_token (what the next forward and sampling need): the id, the grammar,
        stop tokens, max_new_tokens. The overlap schedule decodes the text a step later (add_token_text)."""
        self.output_ids.append(token_id)
        n_out = len(self.output_ids)
        sp = self.sampling_params
        if self.grammar is not None and self.grammar.accept(token_id):  # the grammar is complete
            self.finished_reason = {"type": "stop", "matched": token_id}
        elif token_id in self.stop_token_ids and n_out >= sp.min_new_tokens:
            self.finished_reason = {"type": "stop", "matched": token_id}
        elif n_out >= self.max_new_tokens:
            self.finished_reason = {"type": "length", "length": self.max_new_tokens}

    def add_token_text(self, n_out: int) -> None:
        """The text half of append_token for output token n_out (1-based): detokenize it, check stop strings.
        Tokens are added in order, each before the next one's append_token_id."""
        token_id = self.output_ids[n_out - 1]
        sp = self.sampling_params
        if self.detok is None:
            return
        # A matched stop token is not part of the text.
        if self.finished_reason and self.finished_reason["type"] == "stop":
            piece = self.detok.flush()
        else:
            piece = self.detok.add([token_id])
            if self.finished_reason:
                piece += self.detok.flush()
        if not piece:
            return
        text, self.output_text = self.output_text, ""  # the one reference left: += grows it in place, not a copy
        start = len(text)
        text += piece
        self.output_text = text
        if (sp.stop_strs or self.stop_regexes) and n_out >= sp.min_new_tokens:
            hit = find_stop(self.output_text, sp.stop_strs, start) if sp.stop_strs else None
            if hit is not None:
                hit = (hit[0], hit[0] + len(hit[1]), hit[1])
            # a regex is searched over the whole text: a match may begin in text confirmed earlier (`a.*b`)
            try:
                rhit = find_stop_regex(self.output_text, self.stop_regexes) if self.stop_regexes else None
            except TimeoutError:
                return self._regex_too_slow()
            if rhit is not None and (hit is None or rhit[0] < hit[0]):
                hit = rhit
            if hit is not None:
                idx, end, matched = hit
                self.output_text = self.output_text[: idx if not sp.no_stop_trim else end]
                self.finished_reason = {"type": "stop", "matched": matched}  # a regex reports its pattern (upstream)

    def _regex_too_slow(self) -> None:
        self.abort(f"Invalid value for stop_regex: searching {len(self.output_text)} characters of output took over "
                   f"{STOP_REGEX_SEARCH_TIMEOUT_S} s (the pattern backtracks too much). Use a simpler pattern, e.g. "
                   "without nested repetition such as (a|a)+.", status_code=400)

    def abort(self, message: str = "Request aborted", status_code: Optional[int] = None) -> None:
        """Finish with {"type": "abort", "message", ["status_code"]}: 4xx/5xx codes reach an HTTP client as an error."""
        self.finished_reason = {"type": "abort", "message": message}
        if status_code is not None:
            self.finished_reason["status_code"] = status_code

    def text_delta(self) -> str:
        """Unsent text, holding back a suffix that might still grow into a stop string."""
        end = len(self.output_text)
        if not self.finished() and self.sampling_params.stop_strs:
            end -= held_back_len(self.output_text, self.sampling_params.stop_strs)
        if not self.finished() and self.stop_regexes:
            try:
                end = min(end, len(self.output_text) - regex_held_back_len(self.output_text, self.stop_regexes))
            except TimeoutError:
                self._regex_too_slow()
                end = self.sent_text_len
        end = max(end, self.sent_text_len)
        delta = self.output_text[self.sent_text_len : end]
        self.sent_text_len = end
        return delta

    def reset_memory_state(self) -> None:
        """After its memory was released: back to 'nothing in the pool' (it will prefill fill_ids again)."""
        self.req_pool_idx = None
        self.kv_len = 0
        self.alloc_len = 0
        self.prefix_len = 0
        self.windowed_freed_len = 0
        self.window_released = False
        self.last_node = None

    def __repr__(self) -> str:
        return f"Req(rid={self.rid}, input={len(self.origin_input_ids)}, output={len(self.output_ids)}, kv={self.kv_len})"

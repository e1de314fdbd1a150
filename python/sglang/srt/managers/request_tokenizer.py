"""RequestTokenizer: prompt text or ids + sampling params -> TokenizedGenerateReqInput, checked against the model's
limits. Plain blocking code: the TokenizerManager runs it on the OffLoopExecutor, never on the event loop.

A prompt with more characters than could ever fit is refused before it is tokenized: one token covers at most
`max_token_bytes` bytes of text (the longest vocabulary entry), so a prompt of more than
max_req_input_len * max_token_bytes * PROMPT_CHARS_MARGIN characters has more tokens than the context allows.
This bounds the work a request can demand from the tokenizer (a 10 MB prompt costs ~8 s of encoding and ~200 ms of
GIL while the encoding is freed) without changing the answer for any prompt that could fit.
"""

from __future__ import annotations

from typing import Any, List, Optional

from sglang.srt.constrained.grammar_check import check_request_grammar
from sglang.srt.managers.io_struct import TokenizedGenerateReqInput, new_rid
from sglang.srt.managers.request_error import RequestError
from sglang.srt.multimodal.memory_release import MEDIA_MEMORY
from sglang.srt.multimodal.processors.base_processor import as_list
from sglang.srt.sampling.custom_logit_processor import check_loadable
from sglang.srt.sampling.sampling_params import SamplingParams

# Normalizers may shrink text before it is split (whitespace collapsing, NFKC); the margin keeps the bound safe.
PROMPT_CHARS_MARGIN = 2


def max_token_bytes(tokenizer: Any) -> Optional[int]:
    """Upper bound on the text bytes one token covers (UTF-8 length of the longest vocabulary string, which is at
    least the raw bytes for byte-level BPE and SentencePiece vocabularies alike). None if the vocab is unknown."""
    try:
        vocab = tokenizer.get_vocab()
    except Exception:  # noqa: BLE001 - the bound is an optimisation; without it every prompt is tokenized
        return None
    return max((len(t.encode("utf-8", "surrogatepass")) for t in vocab), default=None)


class RequestTokenizer:
    def __init__(self, tokenizer: Any, mm_processor: Any, vocab_size: int, context_len: int, max_req_len: int,
                 max_req_input_len: int, grammar_backend: str = "xgrammar",
                 enable_custom_logit_processor: bool = False):
        self.tokenizer = tokenizer
        self.mm_processor = mm_processor
        self.vocab_size = vocab_size
        self.context_len = context_len
        self.max_req_len = max_req_len
        self.max_req_input_len = max_req_input_len
        self.grammar_backend = grammar_backend
        self.enable_custom_logit_processor = enable_custom_logit_processor
        per_token = max_token_bytes(tokenizer) if tokenizer is not None else None
        self.max_prompt_chars: Optional[int] = (
            max_req_input_len * per_token * PROMPT_CHARS_MARGIN if per_token else None
        )

    def encode(self, text: str, add_special_tokens: bool = True, param: str = "prompt") -> List[int]:
        if self.tokenizer is None:
            raise RequestError(400, "This server runs without a tokenizer (--skip-tokenizer-init); send input_ids.")
        if self.max_prompt_chars is not None and len(text) > self.max_prompt_chars:
            raise RequestError(
                400,
                f"The input ({len(text):,} characters) cannot fit in the model's context length ({self.context_len} "
                f"tokens; at most {self.max_req_input_len} input tokens are accepted, and no text longer than "
                f"{self.max_prompt_chars:,} characters fits in them). Shorten the prompt.",
                param=param,
                code="context_length_exceeded",
            )
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, ids: List[int], skip_special_tokens: bool = False) -> str:
        if self.tokenizer is None:
            raise RequestError(400, "This server runs without a tokenizer (--skip-tokenizer-init).")
        self.check_token_ids(ids, param="tokens")
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def check_token_ids(self, ids: List[int], param: str = "input_ids") -> None:
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise RequestError(
                400, f"Token id {bad[0]} is out of range; token ids must be in [0, {self.vocab_size}).", param=param
            )

    def tokenize_request(
        self,
        *,
        text: Optional[str] = None,
        input_ids: Optional[List[int]] = None,
        sampling_params: Optional[dict] = None,
        rid: Optional[str] = None,
        stream: bool = False,
        return_logprob: bool = False,
        top_logprobs_num: int = 0,
        image_data: Any = None,
        video_data: Any = None,
        audio_data: Any = None,
        add_special_tokens: bool = True,
        prompt_param: str = "prompt",
        max_tokens_param: str = "max_tokens",
        custom_logit_processor: Optional[str] = None,
    ) -> TokenizedGenerateReqInput:
        """Validate one prompt + sampling params against the model's limits. Raises RequestError(400)."""
        sent = [m for m, d in (("audio", audio_data), ("video", video_data), ("image", image_data)) if d]
        mm_param = "messages" if prompt_param == "messages" else f"{sent[0] if sent else 'image'}_data"
        if sent and self.mm_processor is None:
            raise RequestError(400, f"This model does not accept {sent[0]} inputs; send text only.", param=mm_param)
        if input_ids is None:
            if text is None:
                raise RequestError(400, "Either text or input_ids must be provided.", param=prompt_param)
            input_ids = self.encode(text, add_special_tokens=add_special_tokens, param=prompt_param)
        else:
            self.check_token_ids(input_ids, param=prompt_param)
        if self.mm_processor is not None:
            self.check_placeholders(input_ids, image_data, video_data, audio_data, prompt_param)
        mm_inputs = None
        if sent:  # image / video / audio decoding and preprocessing: on this (pool) thread too
            try:
                extra = {"audio_data": audio_data} if audio_data else {}
                with MEDIA_MEMORY.job():  # its buffers go back to the OS after a burst (memory_release.py)
                    mm_inputs = self.mm_processor.process(input_ids, image_data, video_data, **extra)
            except ValueError as e:
                raise RequestError(400, str(e), param=mm_param) from e
            input_ids = mm_inputs.input_ids
        num_input = len(input_ids)
        if num_input == 0:
            raise RequestError(400, "The prompt is empty; send at least one token.", param=prompt_param)
        if num_input > self.max_req_input_len:
            raise RequestError(
                400,
                f"The input ({num_input} tokens) is longer than the model's context length "
                f"({self.context_len} tokens; at most {self.max_req_input_len} input tokens are accepted). "
                "Shorten the prompt.",
                param=prompt_param,
                code="context_length_exceeded",
            )

        params = dict(sampling_params or {})
        room = self.max_req_len - num_input
        if "max_new_tokens" not in params:  # the native API's default, clipped to what fits
            params["max_new_tokens"] = min(SamplingParams.max_new_tokens, room)
        requested = params["max_new_tokens"]
        if requested is None:  # "as many as fit" (chat without max_tokens)
            params["max_new_tokens"] = room
        elif isinstance(requested, int) and not isinstance(requested, bool) and requested >= self.max_req_len:
            raise RequestError(  # the completion alone cannot fit: upstream's words first
                400,
                f"max_completion_tokens is too large: {requested}. This model supports at most {self.max_req_len} "
                f"completion tokens (its context, less the prompt); set {max_tokens_param} to at most {room} for "
                f"this prompt of {num_input} tokens.",
                param=max_tokens_param,
                code="context_length_exceeded",
            )
        elif isinstance(requested, int) and not isinstance(requested, bool) and requested > room:
            raise RequestError(
                400,
                # upstream's words first (clients match on them), then what to change here
                f"Requested token count exceeds the model's maximum context length of {self.max_req_len} tokens. "
                f"You requested a total of {num_input + requested} tokens: {num_input} tokens from the input "
                f"messages and {requested} tokens for the completion. Reduce the prompt or set {max_tokens_param} to "
                f"at most {room}.",
                param=max_tokens_param,
                code="context_length_exceeded",
            )
        try:
            sp = SamplingParams.from_dict(params)
            sp.verify(self.vocab_size)
            check_request_grammar(sp.grammar, self.grammar_backend)  # parses, and the server has a backend
        except (ValueError, TypeError) as e:
            raise RequestError(400, str(e), param=getattr(e, "param", None)) from e
        return TokenizedGenerateReqInput(
            rid=rid or new_rid(),
            input_text=text,
            input_ids=list(input_ids),
            sampling_params=sp,
            stream=stream,
            return_logprob=return_logprob,
            top_logprobs_num=top_logprobs_num,
            mm_inputs=mm_inputs,
            custom_logit_processor=self.check_custom_logit_processor(custom_logit_processor),
        )

    def check_placeholders(self, input_ids: List[int], image_data: Any, video_data: Any, audio_data: Any,
                           param: str) -> None:
        """A prompt's placeholder tokens for a modality with no items sent are refused, as a count mismatch with
        items sent is: either way the prompt and the media disagree."""
        counts = {m: len(as_list(d)) for m, d in (("image", image_data), ("video", video_data), ("audio", audio_data))}
        stray = self.mm_processor.unmatched_placeholders(input_ids, counts)
        if not stray:
            return
        modality, n = next(iter(stray.items()))
        token = self.mm_processor.placeholder_ids()[modality]
        name = self.tokenizer.convert_ids_to_tokens(token) if self.tokenizer is not None else f"token id {token}"
        where = "message parts" if param == "messages" else f"{modality}_data"
        raise RequestError(400, f"The {param} has {n} {modality} placeholder token(s) {name} but no {modality} was "
                           f"sent; send one {modality} per placeholder in {where}, or remove the placeholders.",
                           param=param)

    def check_custom_logit_processor(self, processor: Optional[str]) -> Optional[str]:
        """A client-sent processor only with --enable-custom-logit-processor, and only one that loads."""
        if processor is None:
            return None
        if not self.enable_custom_logit_processor:
            raise RequestError(400, "custom_logit_processor is refused: this server was not started with "
                               "--enable-custom-logit-processor (which runs Python sent by clients; see its --help).",
                               param="custom_logit_processor")
        try:
            check_loadable(processor)
        except ValueError as e:
            raise RequestError(400, f"custom_logit_processor: {e}", param="custom_logit_processor") from None
        return processor

"""The prompt-logprob fields of a request, checked at the edge once its prompt is tokenized (the ranges are pydantic's,
sampling/validation.py; these checks need the prompt): a RequestError(400) names the field and what to change.

    logprob_start_len   -1 (output logprobs only) or a prompt position: positions [start, len(prompt)) get logprobs
    token_ids_logprob   these ids' logprobs at every returned position (prompt and output)
Both need return_logprob. A multimodal prompt has no prompt logprobs (its placeholder tokens stand for pixels or
samples, not vocabulary tokens).
"""

from __future__ import annotations

from typing import List, Optional

from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.managers.request_error import RequestError
from sglang.srt.sampling.validation import ParamError, check_token_ids_in_vocab


def apply_logprob_fields(t: TokenizedGenerateReqInput, logprob_start_len: int,
                         token_ids_logprob: Optional[List[int]], vocab_size: int, *,
                         start_param: str = "logprob_start_len", ids_param: str = "token_ids_logprob",
                         flag_param: str = "return_logprob") -> TokenizedGenerateReqInput:
    if logprob_start_len >= 0 or token_ids_logprob:
        if not t.return_logprob:
            given = start_param if logprob_start_len >= 0 else ids_param
            raise RequestError(400, f"{given} needs {flag_param}: set {flag_param} to true, or remove {given}.",
                               param=given)
    if logprob_start_len >= 0:
        n = len(t.input_ids)
        if logprob_start_len >= n:
            raise RequestError(400, f"Invalid value for {start_param}: the prompt has {n} tokens, so prompt logprobs "
                                    f"start at a position in [0, {n - 1}] (got {logprob_start_len}).",
                               param=start_param)
        if t.mm_inputs is not None:
            raise RequestError(400, f"{start_param}: a prompt with images, video or audio has no prompt logprobs "
                                    f"(its media tokens are not vocabulary tokens); remove {start_param}.",
                               param=start_param)
    if token_ids_logprob:
        try:
            check_token_ids_in_vocab(token_ids_logprob, vocab_size, ids_param)
        except ParamError as e:
            raise RequestError(400, str(e), param=ids_param) from None
    t.logprob_start_len = logprob_start_len
    t.token_ids_logprob = list(token_ids_logprob) if token_ids_logprob else None
    return t

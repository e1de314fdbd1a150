"""Inputs and outputs of an embedding request, shared by POST /v1/embeddings and Engine.encode (--is-embedding).

`input` takes OpenAI's four shapes: a string, a list of strings, a list of token ids (one input), or a list of lists
of token ids. Each item becomes one prefill-only request (max_new_tokens 1 keeps the scheduler's invariants; the
embedding server finishes it when its prompt is pooled, managers/embedding_output.py). Limits and token ids are
checked by the same RequestTokenizer as every other prompt, under the name `input` (`input[i]` in a batch).
"""

from __future__ import annotations

import base64
from typing import Any, List, Optional, Union

import numpy as np

from sglang.srt.managers.io_struct import ReqOutput, TokenizedGenerateReqInput
from sglang.srt.managers.request_error import RequestError
from sglang.srt.managers.request_tokenizer import RequestTokenizer

EmbeddingItem = Union[str, List[int]]
ENCODING_FORMATS = ("float", "base64")


def _is_token_id(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def embedding_items(value: Any, param: str = "input") -> List[EmbeddingItem]:
    """OpenAI's `input` shapes -> one item per embedding (a 400 naming `param` otherwise)."""
    shapes = "a string, a list of strings, a list of token ids, or a list of lists of token ids"
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value:
        raise RequestError(400, f"`{param}` must be {shapes} (not empty).", param=param)
    if all(isinstance(x, str) for x in value):
        return list(value)
    if all(_is_token_id(x) for x in value):
        return [list(value)]
    if all(isinstance(x, list) and x and all(_is_token_id(t) for t in x) for x in value):
        return [list(x) for x in value]
    raise RequestError(400, f"`{param}` must be {shapes}; its items mix types or include an empty list.", param=param)


def build_embedding_requests(items: List[EmbeddingItem], request_tokenizer: RequestTokenizer,
                             param: str = "input") -> List[TokenizedGenerateReqInput]:
    """One checked request per item (blocking: tokenization; the server runs it off the event loop)."""
    reqs = []
    for i, item in enumerate(items):
        name = param if len(items) == 1 else f"{param}[{i}]"
        text, ids = (item, None) if isinstance(item, str) else (None, item)
        reqs.append(request_tokenizer.tokenize_request(
            text=text, input_ids=ids, sampling_params={"max_new_tokens": 1, "temperature": 0.0},
            prompt_param=name, max_tokens_param=name))
        reqs[-1].is_embedding = True
    return reqs


def check_dimensions(dimensions: Optional[int], hidden_size: int) -> None:
    """`dimensions` is served only as the model's own width (no Matryoshka truncation)."""
    if dimensions is not None and dimensions != hidden_size:
        raise RequestError(400, f"dimensions={dimensions} is not supported: this model's embeddings have {hidden_size} "
                                f"dimensions and it is not served with Matryoshka truncation. Omit `dimensions` or "
                                f"set it to {hidden_size}.", param="dimensions")


def encode_vector(vec: List[float], encoding_format: str) -> Union[List[float], str]:
    """float: the list; base64: the little-endian float32 bytes, base64-encoded (what the `openai` client decodes)."""
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vec, dtype="<f4").tobytes()).decode("ascii")
    return vec


def embedding_of(out: ReqOutput) -> List[float]:
    """The vector of a finished embedding request (a finish without one is a server error, said as such)."""
    if out.embedding is None:
        fr = out.finish_reason or {}
        raise RequestError(int(fr.get("status_code") or 500), fr.get("message") or "The request produced no embedding.")
    return out.embedding

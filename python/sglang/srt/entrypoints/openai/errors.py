"""Error bodies that both OpenAI's and upstream SGLang's clients read:

    {"object": "error", "message", "type", "param", "code",      <- upstream SGLang's ErrorResponse (top level)
     "error": {"message", "type", "param", "code"}}               <- OpenAI's shape

The nested `error.type` follows OpenAI's vocabulary (invalid_request_error, authentication_error, not_found_error,
...); the `openai` client reads the nested object and raises the matching class (BadRequestError, ...). The top-level
fields are upstream's (`type` an exception name such as BadRequestError), for code written against upstream that
reads `body["message"]`.
"""

from __future__ import annotations

from typing import Optional

import orjson
from fastapi.responses import Response

from sglang.srt.sampling.validation_errors import describe_validation_error  # noqa: F401  (the 400 messages)

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    422: "invalid_request_error",
    500: "internal_server_error",
    503: "service_unavailable_error",
}


# upstream SGLang's top-level `type` per status
UPSTREAM_ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    413: "RequestTooLargeError",
    422: "BadRequestError",
    429: "RateLimitError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


def error_body(status_code: int, message: str, param: Optional[str] = None, code: Optional[str] = None) -> dict:
    code = code if code is not None else status_code
    return {
        "object": "error",
        "message": message,
        "type": UPSTREAM_ERROR_TYPES.get(status_code, "BadRequestError" if status_code < 500 else "InternalServerError"),
        "param": param,
        "code": code,
        "error": {
            "message": message,
            "type": ERROR_TYPES.get(status_code, "invalid_request_error"),
            "param": param,
            "code": code,
        },
    }


def error_response(status_code: int, message: str, param: Optional[str] = None, code: Optional[str] = None) -> Response:
    return Response(
        content=orjson.dumps(error_body(status_code, message, param, code)),
        status_code=status_code,
        media_type="application/json",
    )

"""OpenAI-style error bodies: {"error": {"message", "type", "param", "code"}}.

`type` follows OpenAI's vocabulary (invalid_request_error, authentication_error, not_found_error, ...), so the
`openai` client raises the matching exception class (BadRequestError, AuthenticationError, NotFoundError, ...).
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


def error_body(status_code: int, message: str, param: Optional[str] = None, code: Optional[str] = None) -> dict:
    return {
        "error": {
            "message": message,
            "type": ERROR_TYPES.get(status_code, "invalid_request_error"),
            "param": param,
            "code": code if code is not None else status_code,
        }
    }


def error_response(status_code: int, message: str, param: Optional[str] = None, code: Optional[str] = None) -> Response:
    return Response(
        content=orjson.dumps(error_body(status_code, message, param, code)),
        status_code=status_code,
        media_type="application/json",
    )

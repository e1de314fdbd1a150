"""OpenAI-style error bodies: {"error": {"message", "type", "param", "code"}}.

`type` follows OpenAI's vocabulary (invalid_request_error, authentication_error, not_found_error, ...), so the
`openai` client raises the matching exception class (BadRequestError, AuthenticationError, NotFoundError, ...).
"""

from __future__ import annotations

from typing import Optional

import orjson
from fastapi.responses import Response
from pydantic import ValidationError

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


def describe_validation_error(err: ValidationError) -> tuple[str, Optional[str]]:
    """Readable sentences, e.g. "Invalid value for max_tokens: Input should be greater than or equal to 1 (got -5)."

    A value that fits no alternative of a union produces one error per alternative; only the most specific one
    (deepest location, i.e. the alternative the client most likely meant) is reported.
    """
    errors = err.errors(include_url=False)
    if any(_is_branch_label(x) for e in errors for x in e["loc"]):
        deepest = max(len(e["loc"]) for e in errors)
        candidates = [e for e in errors if len(e["loc"]) == deepest]
        # a range/length error says more than "wrong type" from the alternatives that were not meant
        errors = [next((e for e in candidates if not e["type"].endswith("_type")), candidates[0])]
    parts = []
    for e in errors:
        loc = _format_loc(e["loc"])
        if e["type"] == "extra_forbidden":
            parts.append(f"Unrecognized request argument supplied: {loc}.")
        elif e["type"] == "missing":
            parts.append(f"Missing required parameter: {loc}.")
        else:
            parts.append(f"Invalid value for {loc}: {e['msg']} (got {_short(e.get('input'))}).")
    param = str(errors[0]["loc"][0]) if errors and errors[0]["loc"] else None
    return " ".join(dict.fromkeys(parts[:4])), param


_PRIMITIVE_LABELS = {"str", "int", "float", "bool", "dict", "list", "none"}


def _is_branch_label(x) -> bool:
    return isinstance(x, str) and ("[" in x or x in _PRIMITIVE_LABELS)


def _format_loc(loc) -> str:
    out = ""
    for x in loc:
        if _is_branch_label(x):
            continue
        out += f"[{x}]" if isinstance(x, int) else (f".{x}" if out else str(x))
    return out or "body"


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."

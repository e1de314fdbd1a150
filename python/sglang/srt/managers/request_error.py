"""RequestError: an error the client caused (4xx) or must be told about (503), rendered as an OpenAI error body."""

from __future__ import annotations

from typing import Optional


class RequestError(Exception):
    def __init__(self, status_code: int, message: str, param: Optional[str] = None, code: Optional[str] = None):
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.param = param
        self.code = code

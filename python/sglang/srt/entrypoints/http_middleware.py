"""Pure ASGI middlewares of the HTTP server (no response buffering, so streaming and disconnect detection work).

    APIKeyMiddleware         401 unless 'Authorization: Bearer <api-key>'; only AUTH_EXEMPT_PATHS are open
    RequestBodyLimitMiddleware  413 for a body over --max-request-body-mb (or upstream's --max-payload-size), by its Content-Length or, for chunked
                             bodies, as soon as the bytes received pass the limit; nothing past the limit is read
    AdmissionMiddleware      a few requests prepare on the event loop at once (managers/request_admission.py);
                             /health and /metrics are never held

Order (outermost first): API key, then body limit, so an unauthenticated client cannot make the server read a body,
then admission, so a request waits for its place only once its body is in.
"""

from __future__ import annotations

import hmac
from typing import List

import orjson

from sglang.srt.entrypoints.openai.errors import error_body
from sglang.srt.managers.request_admission import RequestAdmission

# reachable without the API key, matched exactly: load balancers and Prometheus scrapers carry no credentials.
# /health_generate runs a generation, so it is not among them.
AUTH_EXEMPT_PATHS = frozenset({"/health", "/metrics"})
# answered at once whatever else is preparing: a load balancer's probe must not wait behind a burst
UNGATED_PATHS = AUTH_EXEMPT_PATHS


async def send_error(send, status_code: int, message: str, code=None, param=None) -> None:
    body = orjson.dumps(error_body(status_code, message, param=param, code=code))
    await send({"type": "http.response.start", "status": status_code,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class APIKeyMiddleware:
    def __init__(self, app, api_key: str):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] == "OPTIONS" or scope["path"] in AUTH_EXEMPT_PATHS:
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(b"authorization", b"")
        if not hmac.compare_digest(given, self.expected):
            return await send_error(
                send, 401, "Incorrect API key provided. Send it as 'Authorization: Bearer <api-key>'.",
                code="invalid_api_key",
            )
        return await self.app(scope, receive, send)


PAYLOAD_TOO_LARGE = "Payload Too Large"  # RFC 7231's reason phrase for 413, which upstream's tests read


def use_payload_too_large_reason() -> None:
    """Make uvicorn's status line for 413 read "413 Payload Too Large". ASGI gives an app no way to set the reason
    phrase, and uvicorn takes it from Python's HTTPStatus, whose phrase for 413 is "Request Entity Too Large"
    (RFC 2616; "Content Too Large" from Python 3.13). Only uvicorn's h11 protocol (the one installed) has the table."""
    try:
        from uvicorn.protocols.http import h11_impl
    except ImportError:  # another server runs the app: its own phrase stands
        return
    h11_impl.STATUS_PHRASES[413] = PAYLOAD_TOO_LARGE.encode()


class RequestBodyLimitMiddleware:
    """Reads the whole body first (every route parses all of it anyway), counting bytes, then replays its chunks."""

    def __init__(self, app, max_body_bytes: int, flag: str = "--max-request-body-mb"):
        use_payload_too_large_reason()
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.flag = flag  # the flag that set the limit (ServerArgs.request_body_limit), named in the 413

    def _amount(self, size_bytes: int, mib_format: str) -> str:
        """In the unit of the flag that set the limit: bytes (upstream's --max-payload-size), else MiB."""
        if self.flag == "--max-payload-size":
            return f"{size_bytes} bytes"
        return f"{size_bytes / (1 << 20):{mib_format}} MiB"

    def too_large(self, size_bytes: int, exact: bool) -> str:
        limit = self._amount(self.max_body_bytes, "g")
        size = self._amount(size_bytes, ".1f") if exact else f"more than {limit}"
        return (f"{PAYLOAD_TOO_LARGE}: the request body is {size}; this server accepts at most {limit} "
                f"({self.flag}). Send a smaller request, or raise {self.flag}.")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            return await send_error(send, 413, self.too_large(int(declared), exact=True), code="request_too_large")
        chunks: List[bytes] = []
        received = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before sending its body
            chunk = message.get("body", b"")
            received += len(chunk)
            if received > self.max_body_bytes:
                return await send_error(send, 413, self.too_large(received, exact=False), code="request_too_large")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        pending = iter(range(len(chunks)))

        async def replay():
            # the chunks as they came (joining them here would add a copy: Starlette joins them again)
            i = next(pending, None)
            if i is None:
                return await receive()  # after the body: http.disconnect, for disconnect detection
            chunk, chunks[i] = chunks[i], b""  # handed over: the app owns it now
            return {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}

        return await self.app(scope, replay, send)


class AdmissionMiddleware:
    def __init__(self, app, admission: RequestAdmission):
        self.app = app
        self.admission = admission

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in UNGATED_PATHS:
            return await self.app(scope, receive, send)
        release = await self.admission.admit()

        async def send_releasing(message):
            if message["type"] == "http.response.start":
                release()
            await send(message)

        try:
            return await self.app(scope, receive, send_releasing)
        finally:
            release()

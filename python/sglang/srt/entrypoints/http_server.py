"""The HTTP server: FastAPI routes over a TokenizerManager, and launch_server() which runs the whole thing.

Process layout (like upstream):
    main process       uvicorn + FastAPI + TokenizerManager (tokenization, request state, SSE)
    scheduler process  Scheduler (model, KV pools, batching, detokenization), spawned, connected by ZMQ
The event loop of the main process never runs the model, so /health answers while a long batch runs.

launch_server() blocks until SIGINT/SIGTERM, then stops uvicorn, aborts what is running and terminates the
scheduler process; the scheduler process also kills itself if this process dies without cleaning up.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import multiprocessing as mp
import os
import signal
import socket
import sys
import time
from contextlib import asynccontextmanager

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from sglang.srt.entrypoints.openai.errors import error_body, error_response
from sglang.srt.entrypoints.openai.protocol import AbortRequest
from sglang.srt.entrypoints.openai.serving_base import json_response, parse_body
from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
from sglang.srt.entrypoints.openai.serving_completions import OpenAIServingCompletion
from sglang.srt.entrypoints.openai.serving_tokenize import OpenAIServingDetokenize, OpenAIServingTokenize
from sglang.srt.entrypoints.serving_generate import ServingGenerate
from sglang.srt.managers.port_args import PortArgs
from sglang.srt.managers.tokenizer_manager import RequestError, TokenizerManager, preload_tokenizer
from sglang.srt.server_args import ServerArgs
from sglang.version import __version__

logger = logging.getLogger(__name__)

SCHEDULER_STARTUP_TIMEOUT_S = 600.0
SCHEDULER_STOP_TIMEOUT_S = 5.0
GRACEFUL_SHUTDOWN_TIMEOUT_S = 3.0
SCHEDULER_WATCH_INTERVAL_S = 0.2
# reachable without the API key: load balancers and Prometheus scrapers carry no credentials
AUTH_EXEMPT_PREFIXES = ("/health", "/metrics")


# ====================================================================== app
class APIKeyMiddleware:
    """Pure ASGI middleware (no response buffering, so streaming and disconnect detection are untouched)."""

    def __init__(self, app, api_key: str):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] == "OPTIONS" or scope["path"].startswith(AUTH_EXEMPT_PREFIXES):
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(b"authorization", b"")
        if not hmac.compare_digest(given, self.expected):
            body = orjson.dumps(error_body(
                401, "Incorrect API key provided. Send it as 'Authorization: Bearer <api-key>'.", code="invalid_api_key"
            ))
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        return await self.app(scope, receive, send)


def create_app(tm: TokenizerManager) -> FastAPI:
    server_args = tm.server_args

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        tm.start()
        yield
        tm.is_shutting_down = True
        tm.abort_all()

    app = FastAPI(title="SGLang", version=__version__, lifespan=lifespan)
    app.state.tokenizer_manager = tm
    if server_args.api_key:
        app.add_middleware(APIKeyMiddleware, api_key=server_args.api_key)

    serving_chat = OpenAIServingChat(tm)
    serving_completion = OpenAIServingCompletion(tm)
    serving_tokenize = OpenAIServingTokenize(tm)
    serving_detokenize = OpenAIServingDetokenize(tm)
    serving_generate = ServingGenerate(tm)

    @app.exception_handler(StarletteHTTPException)
    async def http_exception_handler(request: Request, exc: StarletteHTTPException):
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404:
            message = f"Unknown endpoint {request.method} {request.url.path}."
        elif exc.status_code == 405:
            message = f"Method {request.method} is not allowed for {request.url.path}."
        return error_response(exc.status_code, message)

    @app.exception_handler(RequestError)
    async def request_error_handler(request: Request, exc: RequestError):
        return error_response(exc.status_code, exc.message, exc.param, exc.code)

    @app.exception_handler(Exception)
    async def internal_error_handler(request: Request, exc: Exception):
        logger.exception("Internal error on %s", request.url.path)
        return error_response(500, f"Internal server error: {type(exc).__name__}: {exc}")

    # ---------------------------------------------------------------- health and info
    @app.get("/health")
    async def health():
        if not tm.is_healthy:
            return error_response(503, tm.fatal_error or "The server is shutting down.")
        return Response(status_code=200)

    @app.get("/health_generate")
    async def health_generate():
        if tm.is_healthy and await tm.health_generate():
            return Response(status_code=200)
        return error_response(503, "The server did not produce a token in time.")

    @app.get("/get_model_info")
    async def get_model_info():
        return json_response({
            "model_path": tm.model_path,
            "tokenizer_path": tm.tokenizer_path,
            "served_model_name": tm.served_model_name,
            "is_generation": True,
            "context_len": tm.context_len,
            "vocab_size": tm.vocab_size,
        })

    async def server_info():
        info = await tm.get_server_info()
        return json_response({**server_args.to_dict(), **info, "version": __version__})

    app.get("/server_info")(server_info)
    app.get("/get_server_info")(server_info)

    @app.post("/flush_cache")
    async def flush_cache():
        if await tm.flush_cache():
            return PlainTextResponse("Cache flushed.\n")
        return error_response(400, "Cache not flushed: requests are running or waiting; retry when the server is idle.")

    @app.post("/abort_request")
    async def abort_request(raw_request: Request):
        req = await parse_body(raw_request, AbortRequest)
        if req.abort_all:
            tm.abort_all()
        elif req.rid:
            tm.abort_request(req.rid)
        else:
            raise RequestError(400, "Send a rid, or abort_all: true.", param="rid")
        return Response(status_code=200)

    # ---------------------------------------------------------------- generation
    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(raw_request: Request):
        return await serving_generate.handle_request(raw_request)

    @app.post("/v1/completions")
    async def v1_completions(raw_request: Request):
        return await serving_completion.handle_request(raw_request)

    @app.post("/v1/chat/completions")
    async def v1_chat_completions(raw_request: Request):
        return await serving_chat.handle_request(raw_request)

    @app.api_route("/v1/tokenize", methods=["POST"])
    @app.api_route("/tokenize", methods=["POST"])
    async def tokenize(raw_request: Request):
        return await serving_tokenize.handle_request(raw_request)

    @app.api_route("/v1/detokenize", methods=["POST"])
    @app.api_route("/detokenize", methods=["POST"])
    async def detokenize(raw_request: Request):
        return await serving_detokenize.handle_request(raw_request)

    def model_card() -> dict:
        return {
            "id": tm.served_model_name,
            "object": "model",
            "created": int(tm.start_time),
            "owned_by": "sglang",
            "root": tm.model_path,
            "max_model_len": tm.context_len,
        }

    @app.get("/v1/models")
    async def list_models():
        return json_response({"object": "list", "data": [model_card()]})

    @app.get("/v1/models/{model:path}")
    async def retrieve_model(model: str):
        serving_chat.check_model(model)
        return json_response(model_card())

    # ---------------------------------------------------------------- metrics
    if tm.metrics is not None:
        from prometheus_client import CONTENT_TYPE_LATEST

        @app.get("/metrics")
        async def metrics():
            return Response(tm.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    return app


# ====================================================================== launch
def check_port_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise SystemExit(f"Cannot bind {host}:{port} ({e.strerror}); pick another port with --port.") from None


def launch_scheduler_process(server_args: ServerArgs, port_args: PortArgs):
    from sglang.srt.managers.scheduler_process import run_scheduler_process

    ctx = mp.get_context("spawn")  # never fork a process that may hold threads, sockets or a torch runtime
    reader, writer = ctx.Pipe(duplex=False)
    proc = ctx.Process(
        target=run_scheduler_process, args=(server_args, port_args, writer, os.getpid()), name="sglang-scheduler",
        daemon=True,
    )
    proc.start()
    writer.close()
    return proc, reader


def wait_for_scheduler(proc, reader, timeout_s: float = SCHEDULER_STARTUP_TIMEOUT_S) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if reader.poll(0.2):
            try:
                info = reader.recv()
            except EOFError:
                break
            if info.get("status") != "ready":
                raise RuntimeError(f"The scheduler failed to start: {info.get('message')}")
            return info
        if not proc.is_alive():
            break
    raise RuntimeError(f"The scheduler process exited during startup (exit code {proc.exitcode}); see its log above.")


def stop_process(proc) -> None:
    if proc is None or not proc.is_alive():
        return
    proc.terminate()
    proc.join(SCHEDULER_STOP_TIMEOUT_S)
    if proc.is_alive():
        proc.kill()
        proc.join(SCHEDULER_STOP_TIMEOUT_S)


async def serve(app: FastAPI, tm: TokenizerManager, proc, server_args: ServerArgs, started: float) -> None:
    import uvicorn

    config = uvicorn.Config(
        app,
        host=server_args.host,
        port=server_args.port,
        log_level=server_args.log_level,
        access_log=server_args.log_level == "debug",
        timeout_keep_alive=5,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_TIMEOUT_S,
    )
    server = uvicorn.Server(config)

    def stop():
        server.should_exit = True

    tm.on_fatal = stop

    async def watch():
        while True:
            if server.should_exit:
                # end in-flight streams now (finish_reason "abort", then [DONE]) rather than at the graceful timeout
                tm.is_shutting_down = True
                tm.abort_all()
                return
            if not proc.is_alive():
                tm.scheduler_died(f"the scheduler process exited with code {proc.exitcode}")
                return
            await asyncio.sleep(SCHEDULER_WATCH_INTERVAL_S)

    async def announce():
        while not server.started and not server.should_exit:
            await asyncio.sleep(0.05)
        if server.started:
            url = f"http://{server_args.host}:{server_args.port}"
            print(f"SGLang server ready at {url} (model: {tm.served_model_name}, "
                  f"startup {time.perf_counter() - started:.1f} s)", flush=True)

    watcher = asyncio.ensure_future(watch())
    announcer = asyncio.ensure_future(announce())
    try:
        await server.serve()
    finally:
        watcher.cancel()
        announcer.cancel()


def _raise_system_exit(signum, frame):
    raise SystemExit(0)


def launch_server(server_args: ServerArgs) -> None:
    """Start the scheduler process and the HTTP server; return after a clean shutdown."""
    started = time.perf_counter()
    logging.basicConfig(
        level=server_args.log_level.upper(),
        format="[%(asctime)s] %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
    )
    check_port_free(server_args.host, server_args.port)
    port_args = PortArgs.init_new()
    proc = None
    # uvicorn re-raises the signal that stopped it; turn SIGTERM into SystemExit so the cleanup below runs
    signal.signal(signal.SIGTERM, _raise_system_exit)
    try:
        proc, reader = launch_scheduler_process(server_args, port_args)
        preloaded = preload_tokenizer(server_args)  # overlaps with the model load in the scheduler process
        info = wait_for_scheduler(proc, reader)
        tm = TokenizerManager(server_args, port_args, info, preloaded)
        app = create_app(tm)
        asyncio.run(serve(app, tm, proc, server_args, started))
    except (KeyboardInterrupt, SystemExit):
        pass
    except RuntimeError as e:
        logger.error("%s", e)
        stop_process(proc)
        port_args.cleanup()
        sys.exit(1)
    finally:
        stop_process(proc)
        port_args.cleanup()
    logger.info("Server stopped.")

"""The FastAPI application over a TokenizerManager: the routes of the HTTP server (launch_server in http_server.py).

Imported only once the scheduler process is spawned, so importing FastAPI and the OpenAI layer overlaps with the
scheduler's start instead of delaying it.
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from sglang.srt.entrypoints.http_middleware import AdmissionMiddleware, APIKeyMiddleware, RequestBodyLimitMiddleware
from sglang.srt.entrypoints.openai.errors import error_response
from sglang.srt.entrypoints.openai.openapi_bodies import install_request_schemas, json_body
from sglang.srt.entrypoints.openai.protocol import (
    AbortRequest,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    GenerateRequest,
    TokenizeRequest,
)
from sglang.srt.entrypoints.openai.protocol_responses import ResponsesRequest
from sglang.srt.entrypoints.openai.serving_base import is_known_model, json_response, parse_body
from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
from sglang.srt.entrypoints.openai.serving_completions import OpenAIServingCompletion
from sglang.srt.entrypoints.openai.serving_score import OpenAIServingScore, ScoreRequest
from sglang.srt.entrypoints.openai.serving_responses import OpenAIServingResponses
from sglang.srt.entrypoints.openai.serving_embedding import EmbeddingRequest, OpenAIServingEmbedding
from sglang.srt.entrypoints.openai.serving_tokenize import OpenAIServingDetokenize, OpenAIServingTokenize
from sglang.srt.entrypoints.serving_generate import ServingGenerate
from sglang.srt.managers.tokenizer_manager import RequestError, TokenizerManager
from sglang.srt.model_loader.model_path import default_model_path
from sglang.version import __version__

logger = logging.getLogger(__name__)


# ====================================================================== app
def create_app(tm: TokenizerManager) -> FastAPI:
    server_args = tm.server_args

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        tm.start()
        yield
        tm.is_shutting_down = True
        tm.abort_all()
        if tm.template_sandbox is not None:
            await tm.template_sandbox.aclose()

    app = FastAPI(title="SGLang", version=__version__, lifespan=lifespan)
    app.state.tokenizer_manager = tm
    # the last added runs first: the API key is checked before any body is read, admission once it is read
    app.add_middleware(AdmissionMiddleware, admission=tm.admission)
    body_bytes, body_flag = server_args.request_body_limit()
    app.add_middleware(RequestBodyLimitMiddleware, max_body_bytes=body_bytes, flag=body_flag)
    if server_args.api_key:
        app.add_middleware(APIKeyMiddleware, api_key=server_args.api_key)

    serving_chat = OpenAIServingChat(tm)
    serving_completion = OpenAIServingCompletion(tm)
    serving_tokenize = OpenAIServingTokenize(tm)
    serving_detokenize = OpenAIServingDetokenize(tm)
    serving_generate = ServingGenerate(tm)
    serving_score = OpenAIServingScore(tm)
    serving_responses = OpenAIServingResponses(tm)
    serving_embedding = OpenAIServingEmbedding(tm)

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
        """{"status": "ok"}; 503 with an error body when the scheduler has failed or the server is stopping."""
        if not tm.is_healthy:
            return error_response(503, tm.fatal_error or "The server is shutting down.")
        return json_response({"status": "ok"})

    @app.get("/health_generate")
    async def health_generate():
        """Like /health, after the scheduler has produced a token (behind the API key: it runs a generation)."""
        if not tm.is_healthy:
            return error_response(503, tm.fatal_error or "The server is shutting down.")
        if await tm.health_generate():
            return json_response({"status": "ok"})
        return error_response(503, "The server did not produce a token in time.")

    @app.get("/model_info")  # upstream's current name; sglang-router asks it first
    @app.get("/get_model_info")
    async def get_model_info():
        return json_response({
            "model_path": tm.model_path,
            "tokenizer_path": tm.tokenizer_path,
            "served_model_name": tm.served_model_name,
            "is_generation": not server_args.is_embedding,
            "context_len": tm.context_len,
            "vocab_size": tm.vocab_size,
        })

    async def server_info():
        info = await tm.get_server_info()
        # the name this server answers to (--served-model-name, else derived from the model): sglang-router lists it
        return json_response({**server_args.to_dict(), **info, "served_model_name": tm.served_model_name,
                              "version": __version__})

    app.get("/server_info")(server_info)
    app.get("/get_server_info")(server_info)

    @app.api_route("/get_memory_pool_size", methods=["GET", "POST"])  # upstream's (deprecated there for /server_info)
    async def get_memory_pool_size():
        """The KV pool's size in tokens, a bare integer as upstream: /server_info's max_total_num_tokens (the plan's;
        summed over --dp-size replicas)."""
        return json_response((await tm.get_server_info())["max_total_num_tokens"])

    @app.post("/flush_cache")
    async def flush_cache():
        if await tm.flush_cache():
            return PlainTextResponse("Cache flushed.\n")
        return error_response(400, "Cache not flushed: requests are running or waiting; retry when the server is idle.")

    # the handlers read their own bodies (serving_base.parse_body); these declare the bodies in /openapi.json
    install_request_schemas(app, [AbortRequest, GenerateRequest, CompletionRequest, ChatCompletionRequest,
                                  TokenizeRequest, DetokenizeRequest, ResponsesRequest, EmbeddingRequest,
                                  ScoreRequest])

    @app.post("/abort_request", openapi_extra=json_body(AbortRequest))
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
    @app.put("/generate", openapi_extra=json_body(GenerateRequest))
    @app.post("/generate", openapi_extra=json_body(GenerateRequest))
    async def generate(raw_request: Request):
        return await serving_generate.handle_request(raw_request)

    @app.post("/v1/completions", openapi_extra=json_body(CompletionRequest))
    async def v1_completions(raw_request: Request):
        return await serving_completion.handle_request(raw_request)

    @app.post("/v1/chat/completions", openapi_extra=json_body(ChatCompletionRequest))
    async def v1_chat_completions(raw_request: Request):
        return await serving_chat.handle_request(raw_request)

    @app.post("/v1/score", openapi_extra=json_body(ScoreRequest))
    async def v1_score(raw_request: Request):
        return await serving_score.handle_request(raw_request)

    @app.post("/v1/responses", openapi_extra=json_body(ResponsesRequest))
    async def v1_responses(raw_request: Request):
        return await serving_responses.handle_request(raw_request)

    @app.api_route("/v1/responses/{response_id}", methods=["GET", "DELETE"])
    async def v1_stored_response(response_id: str):
        return error_response(404, f"No response {response_id!r}: this server stores no responses (stateless, as "
                              "store: false). Keep the output you received and send it back in `input`.",
                              param="response_id", code="not_found")

    @app.post("/v1/embeddings", openapi_extra=json_body(EmbeddingRequest))
    async def v1_embeddings(raw_request: Request):
        return await serving_embedding.handle_request(raw_request)

    @app.api_route("/v1/tokenize", methods=["POST"], openapi_extra=json_body(TokenizeRequest))
    @app.api_route("/tokenize", methods=["POST"], openapi_extra=json_body(TokenizeRequest))
    async def tokenize(raw_request: Request):
        return await serving_tokenize.handle_request(raw_request)

    @app.api_route("/v1/detokenize", methods=["POST"], openapi_extra=json_body(DetokenizeRequest))
    @app.api_route("/detokenize", methods=["POST"], openapi_extra=json_body(DetokenizeRequest))
    async def detokenize(raw_request: Request):
        return await serving_detokenize.handle_request(raw_request)

    def model_card() -> dict:
        return {
            "id": tm.served_model_name,
            "object": "model",
            "created": int(tm.start_time),
            "owned_by": "sglang",
            "root": tm.server_args.model_path or default_model_path(),  # as given (upstream), not the converted dir
            "max_model_len": tm.context_len,
        }

    @app.get("/v1/models")
    async def list_models():
        return json_response({"object": "list", "data": [model_card()]})

    @app.get("/v1/models/{model:path}")
    async def retrieve_model(model: str):
        if not is_known_model(tm, model):
            return error_response(404, f"The model `{model}` does not exist. This server serves "
                                  f"`{tm.served_model_name}`.", "model", "model_not_found")
        return json_response(model_card())

    # ---------------------------------------------------------------- metrics
    if tm.metrics is not None:
        from prometheus_client import CONTENT_TYPE_LATEST

        @app.get("/metrics")
        async def metrics():
            return Response(tm.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    return app

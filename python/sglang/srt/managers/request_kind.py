"""Which requests a server serves: an --is-embedding server serves embedding requests only (POST /v1/embeddings,
Engine.encode), a generative server none of them. Kept free of torch: the HTTP process checks it on every request."""

from __future__ import annotations

from sglang.srt.managers.request_error import RequestError

NOT_EMBEDDING_MESSAGE = ("This server serves a generative model; embeddings are served by a server started with "
                         "--is-embedding (`sglang serve --model-path ... --is-embedding`).")
GENERATION_REFUSED_MESSAGE = ("This server was started with --is-embedding and serves embeddings only "
                              "(POST /v1/embeddings, Engine.encode); start it without --is-embedding to generate.")


def check_request_kind(is_embedding_request: bool, is_embedding_server: bool) -> None:
    """A 400 saying which server to use when the request's kind is not the server's."""
    if is_embedding_request != is_embedding_server:
        raise RequestError(400, NOT_EMBEDDING_MESSAGE if is_embedding_request else GENERATION_REFUSED_MESSAGE)

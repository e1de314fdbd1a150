"""The HTTP side of `python -m sglang.bench_serving`: one streamed request to POST /v1/completions or, for the chat
backends, POST /v1/chat/completions, timed chunk by chunk.

A request's time to first token (TTFT) is the time until the first chunk that carries text; its inter-token
latencies (ITL) are the gaps between later text chunks (a server that coalesces several tokens into one chunk shows
fewer, longer gaps; TPOT, computed from the token count, is per token either way). Token counts, input and output,
are the server's own, from the usage chunk that `stream_options.include_usage` asks for.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import List

# Upstream's names: the "-chat" backends send one user message to /v1/chat/completions (the server applies the
# model's chat template, as chat clients do); the others send a prompt to /v1/completions.
COMPLETION_BACKENDS = ["sglang", "sglang-oai", "vllm", "lmdeploy", "llama.cpp", "openai"]
CHAT_BACKENDS = ["sglang-oai-chat", "vllm-chat", "lmdeploy-chat", "openai-chat"]
BACKENDS = COMPLETION_BACKENDS + CHAT_BACKENDS
# OpenAI's own API rejects the non-standard ignore_eos field.
NO_IGNORE_EOS_BACKENDS = {"openai", "openai-chat"}


def is_chat(backend: str) -> bool:
    return backend in CHAT_BACKENDS


def endpoint_path(backend: str) -> str:
    return "/v1/chat/completions" if is_chat(backend) else "/v1/completions"


@dataclass
class RequestInput:
    prompt: object  # str, or a list of token ids (completions only)
    prompt_len: int  # tokens for ids, words for text; replaced by the server's count when it reports one
    output_len: int


@dataclass
class RequestOutput:
    success: bool = False
    prompt_len: int = 0
    output_len: int = 0
    ttft_s: float = 0.0
    latency_s: float = 0.0
    itl_s: List[float] = field(default_factory=list)  # gaps between streamed text chunks after the first
    generated_text: str = ""
    error: str = ""


def build_payload(backend: str, model: str, req: RequestInput, ignore_eos: bool = True) -> dict:
    payload = {
        "model": model,
        "max_tokens": req.output_len,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if is_chat(backend):
        payload["messages"] = [{"role": "user", "content": req.prompt}]
    else:
        payload["prompt"] = req.prompt
    if ignore_eos and backend not in NO_IGNORE_EOS_BACKENDS:
        payload["ignore_eos"] = True
    return payload


def chunk_text(obj: dict, chat: bool) -> str:
    """The text one SSE chunk adds: a completion's `text`, or a chat delta's content (reasoning included)."""
    choices = obj.get("choices") or []
    if not choices:
        return ""
    if not chat:
        return choices[0].get("text") or ""
    delta = choices[0].get("delta") or {}
    return (delta.get("reasoning_content") or "") + (delta.get("content") or "")


async def send_request(session, url: str, headers: dict, payload: dict, prompt_len: int) -> RequestOutput:
    chat = "messages" in payload
    out = RequestOutput(prompt_len=prompt_len)
    start = time.perf_counter()
    last = start
    chunks = 0
    usage = None
    text = []
    try:
        async with session.post(url, json=payload, headers=headers) as resp:
            if resp.status != 200:
                out.error = f"HTTP {resp.status}: {(await resp.text())[:300]}"
                return out
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                obj = json.loads(data)
                if "error" in obj:
                    out.error = str(obj["error"])
                    return out
                if obj.get("usage"):
                    usage = obj["usage"]
                piece = chunk_text(obj, chat)
                if not piece:
                    continue
                now = time.perf_counter()
                if chunks == 0:
                    out.ttft_s = now - start
                else:
                    out.itl_s.append(now - last)
                last = now
                chunks += 1
                text.append(piece)
        out.latency_s = time.perf_counter() - start
        out.generated_text = "".join(text)
        out.output_len = usage.get("completion_tokens", chunks) if usage else chunks
        if usage and usage.get("prompt_tokens"):
            out.prompt_len = usage["prompt_tokens"]
        out.success = chunks > 0
        if not out.success:
            out.error = "no tokens streamed"
    except Exception as e:  # noqa: BLE001 - a failed request is a data point, not a crash
        out.error = f"{type(e).__name__}: {e}"
    return out


async def get_model(session, base_url: str, headers: dict) -> str:
    async with session.get(f"{base_url}/v1/models", headers=headers) as resp:
        resp.raise_for_status()
        return (await resp.json())["data"][0]["id"]

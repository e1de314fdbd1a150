"""Units behind the responsive event loop and the process lifecycle, without a server:
the body-size middleware (declared and chunked bodies), the client-template sandbox (time, output and memory
budgets, jinja's sandbox, the worker killed on timeout), the chat-template kwarg policy, the prompt-length bound
that spares the tokenizer hopeless prompts, /health's 503 body, and the removal of IPC directories whose owner died."""

import asyncio
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="cpu")

from sglang.srt.entrypoints.http_middleware import RequestBodyLimitMiddleware  # noqa: E402
from sglang.srt.managers.chat_templating import ChatTemplater  # noqa: E402
from sglang.srt.managers.offloop_executor import OffLoopExecutor  # noqa: E402
from sglang.srt.managers.port_args import OWNER_FILE, PortArgs, remove_stale_ipc_dirs  # noqa: E402
from sglang.srt.managers.request_error import RequestError  # noqa: E402
from sglang.srt.managers.request_tokenizer import RequestTokenizer  # noqa: E402
from sglang.srt.managers.template_sandbox import TemplateSandbox  # noqa: E402

MiB = 1 << 20


# ---------------------------------------------------------------------------------------------- body limit
def run_asgi(middleware_app, headers, chunks):
    """Drive one HTTP request through an ASGI app; returns (status, body, messages the client had to send)."""
    sent = []
    pending = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]

    async def receive():
        if pending:
            sent.append(pending[0])
            return pending.pop(0)
        return {"type": "http.disconnect"}

    out = {}

    async def send(message):
        if message["type"] == "http.response.start":
            out["status"] = message["status"]
        else:
            out["body"] = out.get("body", b"") + message.get("body", b"")

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": headers}
    asyncio.run(middleware_app(scope, receive, send))
    return out.get("status"), out.get("body", b""), sent


async def echo_length_app(scope, receive, send):
    body, more = b"", True
    while more:
        m = await receive()
        body += m.get("body", b"")
        more = m.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": str(len(body)).encode()})


def test_declared_oversized_body_is_refused_before_reading():
    app = RequestBodyLimitMiddleware(echo_length_app, max_body_bytes=1 << 20)
    status, body, sent = run_asgi(app, [(b"content-length", str(MiB + 1).encode())], [b"x" * 10])
    assert status == 413 and not sent
    assert b"--max-request-body-mb" in body and b"request_too_large" in body


def test_chunked_oversized_body_is_refused_once_past_the_limit():
    app = RequestBodyLimitMiddleware(echo_length_app, max_body_bytes=1 << 20)
    chunks = [b"x" * (256 << 10)] * 8  # 2 MiB, no Content-Length
    status, body, sent = run_asgi(app, [], chunks)
    assert status == 413 and b"--max-request-body-mb" in body
    assert len(sent) == 5, "reading stops at the chunk that passes the limit"


def test_body_under_the_limit_reaches_the_app_whole():
    app = RequestBodyLimitMiddleware(echo_length_app, max_body_bytes=1 << 20)
    chunks = [b"x" * (256 << 10)] * 3 + [b"y" * 100]
    status, body, _ = run_asgi(app, [(b"content-length", str(3 * (256 << 10) + 100).encode())], chunks)
    assert status == 200 and int(body) == 3 * (256 << 10) + 100


# ---------------------------------------------------------------------------------------------- template sandbox
def render(sandbox, template, context=None):
    async def go():
        try:
            return await sandbox.render(template, context or {"messages": []})
        finally:
            await sandbox.aclose()

    return asyncio.run(go())


def test_sandbox_renders_a_normal_template():
    sandbox = TemplateSandbox(timeout_s=5, max_output_chars=10_000)
    text = render(sandbox, "{% for m in messages %}[{{ m.role }}]{{ m.content | tojson }}{% endfor %}",
                  {"messages": [{"role": "user", "content": "hé"}]})
    assert text == '[user]"hé"'


def test_runaway_template_is_stopped_at_the_time_budget():
    sandbox = TemplateSandbox(timeout_s=0.5, max_output_chars=10_000)
    heavy = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"  # no output

    async def go():
        await sandbox.prewarm()
        (worker,) = sandbox.idle
        start = time.perf_counter()
        with pytest.raises(RequestError) as e:
            await sandbox.render(heavy, {})
        elapsed = time.perf_counter() - start
        assert sandbox.idle == [worker] and worker.alive, "the worker stopped the render itself and stays warm"
        assert await sandbox.render("ok", {}) == "ok"
        await sandbox.aclose()
        return e.value, elapsed

    err, elapsed = asyncio.run(go())
    assert err.status_code == 400 and "--client-chat-template-timeout-s" in err.message
    assert err.param == "chat_template_kwargs.chat_template" and elapsed < 0.5 + 1.0


def test_unresponsive_worker_is_killed_and_replaced():
    sandbox = TemplateSandbox(timeout_s=0.3, max_output_chars=10_000)

    async def go():
        await sandbox.prewarm()
        (worker,) = sandbox.idle
        os.kill(worker.proc.pid, signal.SIGSTOP)  # as if stuck in C code, deaf to its own alarm
        with pytest.raises(RequestError) as e:
            await sandbox.render("{{ 1 }}", {})
        assert sandbox.num_killed == 1 and worker not in sandbox.workers
        assert worker.proc.wait(10) == -signal.SIGKILL
        assert await sandbox.render("{{ 1 + 1 }}", {}) == "2"  # a fresh worker
        await sandbox.aclose()
        return e.value

    assert "--client-chat-template-timeout-s" in asyncio.run(go()).message


@pytest.mark.parametrize("template,needle", [
    ("{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}", "--client-chat-template-max-output-mb"),
    ("{{ 'x' * 3000000000 }}", "memory budget"),
    ("{{ ''.__class__.__mro__ }}", "failed"),  # jinja's sandbox refuses internals
    ("{% for %}", "not valid jinja"),
])
def test_template_budgets_and_errors_are_400s(template, needle):
    sandbox = TemplateSandbox(timeout_s=10, max_output_chars=1_000_000)
    with pytest.raises(RequestError) as e:
        render(sandbox, template)
    assert e.value.status_code == 400 and needle in e.value.message, e.value.message


# ---------------------------------------------------------------------------------------------- kwarg policy
class FakeTokenizer:
    chat_template = "{{ messages[0].content }}"
    special_tokens_map = {"bos_token": "<s>"}

    def apply_chat_template(self, messages, **kwargs):
        return "model:" + messages[0]["content"]


def apply(templater, kwargs):
    async def go():
        try:
            return await templater.apply([{"role": "user", "content": "hi"}], template_kwargs=kwargs)
        finally:
            if templater.sandbox is not None:
                await templater.sandbox.aclose()

    return asyncio.run(go())


def test_client_template_refused_without_the_flag_and_reserved_kwargs_refused():
    templater = ChatTemplater(FakeTokenizer(), OffLoopExecutor(1), sandbox=None)
    assert apply(templater, {"enable_thinking": False}) == "model:hi"
    with pytest.raises(RequestError) as e:
        apply(templater, {"chat_template": "{{ bos_token }}"})
    assert e.value.param == "chat_template_kwargs.chat_template" and "--allow-client-chat-template" in e.value.message
    with pytest.raises(RequestError) as e:
        apply(templater, {"tokenize": True})
    assert e.value.param == "chat_template_kwargs.tokenize"


def test_client_template_rendered_in_the_sandbox_with_special_tokens():
    sandbox = TemplateSandbox(timeout_s=5, max_output_chars=10_000)
    templater = ChatTemplater(FakeTokenizer(), OffLoopExecutor(1), sandbox)
    out = apply(templater, {"chat_template": "{{ bos_token }}{{ messages[0].content }}{{ flavour }}", "flavour": "!"})
    assert out == "<s>hi!"


# ---------------------------------------------------------------------------------------------- prompt bound
class CountingTokenizer:
    def __init__(self):
        self.calls = 0

    def get_vocab(self):
        return {"a": 0, "abcd": 1, "é": 2}  # longest entry: 4 bytes

    def encode(self, text, add_special_tokens=True):
        self.calls += 1
        return [0] * len(text)


def test_hopeless_prompt_refused_without_tokenizing():
    tok = CountingTokenizer()
    rt = RequestTokenizer(tok, None, vocab_size=3, context_len=100, max_req_len=100, max_req_input_len=99)
    assert rt.max_prompt_chars == 99 * 4 * 2
    with pytest.raises(RequestError) as e:
        rt.tokenize_request(text="a" * (rt.max_prompt_chars + 1))
    assert tok.calls == 0 and e.value.code == "context_length_exceeded" and "context length" in e.value.message
    with pytest.raises(RequestError) as e:  # under the bound: tokenized, then refused by its token count
        rt.tokenize_request(text="a" * 500)
    assert tok.calls == 1 and "(500 tokens)" in e.value.message


# ---------------------------------------------------------------------------------------------- health
def test_unhealthy_server_answers_503_json_and_health_generate_needs_the_key():
    from types import SimpleNamespace

    from starlette.testclient import TestClient

    from sglang.srt.entrypoints.http_server import create_app
    from sglang.srt.managers.request_admission import RequestAdmission
    from sglang.srt.server_args import ServerArgs

    tm = SimpleNamespace(server_args=ServerArgs(api_key="k"), metrics=None, is_healthy=False,
                         fatal_error="the scheduler process exited with code -9", template_sandbox=None,
                         admission=RequestAdmission(1))
    client = TestClient(create_app(tm))  # no lifespan: nothing is started
    r = client.get("/health")
    assert r.status_code == 503 and "exited with code -9" in r.json()["error"]["message"]
    assert client.get("/health_generate").status_code == 401
    assert client.get("/health_generate", headers={"Authorization": "Bearer k"}).status_code == 503


# ---------------------------------------------------------------------------------------------- stale IPC dirs
def make_ipc_dir(root, name, owner=None):
    path = root / f"sglang-ipc-{name}"
    path.mkdir()
    (path / "tokenizer").write_text("")
    if owner is not None:
        (path / OWNER_FILE).write_text(owner)
    return path


def test_stale_ipc_dirs_removed_only_when_their_owner_is_gone(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    me = psutil.Process(os.getpid())
    gone = make_ipc_dir(tmp_path, "dead", f"{dead.pid} {psutil.Process().create_time() - 100}\n")
    recycled = make_ipc_dir(tmp_path, "recycled", f"{os.getpid()} {me.create_time() - 3600}\n")
    alive = make_ipc_dir(tmp_path, "alive", f"{os.getpid()} {me.create_time()!r}\n")
    unknown = make_ipc_dir(tmp_path, "unknown")  # no owner record (an older server, or one being created)
    other = tmp_path / "not-ours"
    other.mkdir()
    removed = remove_stale_ipc_dirs(str(tmp_path))
    assert sorted(removed) == sorted([str(gone), str(recycled)])
    assert alive.exists() and unknown.exists() and other.exists()

    port_args = PortArgs.init_new(str(tmp_path))  # records its owner, and is kept while this process lives
    assert (tmp_path / os.path.basename(port_args.ipc_dir) / OWNER_FILE).exists()
    assert remove_stale_ipc_dirs(str(tmp_path)) == []
    port_args.cleanup()


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))

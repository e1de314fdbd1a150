"""The process that renders client-supplied chat templates (run as a script: `python -I template_sandbox_worker.py
MEMORY_LIMIT_BYTES PARENT_PID`; it imports only the standard library and jinja2, never sglang or torch).

Frames on stdin/stdout: a 4-byte big-endian length, then UTF-8 JSON.
    request   {"template": str, "context": {...template variables...}, "max_output_chars": int, "timeout_s": float}
    response  {"ok": true, "text": str}
              {"ok": false, "kind": "syntax" | "render" | "output_budget" | "memory" | "timeout", "message": str}

Containment: jinja2's ImmutableSandboxedEnvironment (no attribute access to internals, no mutation of the
context, `range` capped); output counted chunk by chunk against the budget; address space capped with RLIMIT_AS;
lower CPU priority; killed with its parent (PR_SET_PDEATHSIG). The time budget is enforced here with SIGALRM (jinja
runs Python bytecode, so the alarm interrupts it and the process stays warm for the next render); the parent kills
the process if no answer comes shortly after the budget (a render stuck in C code). After a MemoryError the process
exits (its heap is suspect) and is replaced.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import struct
import sys
from typing import Any, BinaryIO, Optional

NICE_INCREMENT = 10  # templates are background work next to the HTTP loop and the model
_PR_SET_PDEATHSIG = 1
_FRAME_HEADER = struct.Struct(">I")


def make_environment():
    """A sandbox with the same conveniences Hugging Face gives chat templates (trim/lstrip blocks, loop controls,
    tojson, raise_exception, strftime_now), so templates written for the model hub render the same way."""
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from jinja2.exceptions import TemplateError

    def raise_exception(message: str):
        raise TemplateError(message)

    def tojson(value: Any, ensure_ascii: bool = False, indent: Optional[int] = None, separators=None,
               sort_keys: bool = False) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env


class RenderTimeout(BaseException):
    """Raised by SIGALRM; a BaseException so no `except Exception` on the way can swallow it."""


def _on_alarm(signum, frame):
    raise RenderTimeout()


def render(env, request: dict) -> dict:
    import jinja2

    max_chars = int(request["max_output_chars"])
    timeout_s = float(request.get("timeout_s") or 0)
    try:
        if timeout_s > 0:
            signal.setitimer(signal.ITIMER_REAL, timeout_s)
        template = env.from_string(request["template"])
        parts, total = [], 0
        for chunk in template.generate(**request["context"]):
            total += len(chunk)
            if total > max_chars:
                return {"ok": False, "kind": "output_budget",
                        "message": f"The template's output passed {max_chars:,} characters."}
            parts.append(chunk)
        return {"ok": True, "text": "".join(parts)}
    except jinja2.TemplateSyntaxError as e:
        return {"ok": False, "kind": "syntax", "message": f"line {e.lineno}: {e.message}"}
    except MemoryError:
        return {"ok": False, "kind": "memory", "message": "The template ran out of memory."}
    except RecursionError:
        return {"ok": False, "kind": "render", "message": "The template recursed too deeply."}
    except RenderTimeout:
        return {"ok": False, "kind": "timeout", "message": f"The template ran longer than {timeout_s:g} s."}
    except Exception as e:  # noqa: BLE001 - any failure of the template is the client's to fix
        return {"ok": False, "kind": "render", "message": f"{type(e).__name__}: {e}"}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def read_frame(stream: BinaryIO) -> Optional[bytes]:
    header = stream.read(_FRAME_HEADER.size)
    if len(header) < _FRAME_HEADER.size:
        return None
    (size,) = _FRAME_HEADER.unpack(header)
    payload = stream.read(size)
    return payload if len(payload) == size else None


def write_frame(stream: BinaryIO, payload: bytes) -> None:
    stream.write(_FRAME_HEADER.pack(len(payload)) + payload)
    stream.flush()


def confine(memory_limit_bytes: int, parent_pid: int) -> None:
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except OSError:
            pass
        if parent_pid and os.getppid() != parent_pid:  # the parent died before the death signal was armed
            os._exit(1)
    try:
        os.nice(NICE_INCREMENT)
    except OSError:
        pass
    if memory_limit_bytes > 0:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory_limit_bytes, memory_limit_bytes))


def main() -> None:
    confine(int(sys.argv[1]) if len(sys.argv) > 1 else 0, int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    signal.signal(signal.SIGALRM, _on_alarm)
    env = make_environment()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        payload = read_frame(stdin)
        if payload is None:
            return  # the parent closed the pipe
        response = render(env, json.loads(payload))
        write_frame(stdout, json.dumps(response, ensure_ascii=False).encode("utf-8", "surrogatepass"))
        if response.get("kind") == "memory":
            return


if __name__ == "__main__":
    main()

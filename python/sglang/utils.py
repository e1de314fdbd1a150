"""Client-side helpers with upstream's names (`sglang.utils`): what notebooks, docs and test files import to start
a server from a command line, wait for it, stop it, and put an image into a request.

    from sglang.utils import launch_server_cmd, wait_for_server, terminate_process, encode_image_base64
    process, port = launch_server_cmd("python -m sglang.launch_server --max-total-tokens 8192")
    wait_for_server(f"http://127.0.0.1:{port}")
    ...
    terminate_process(process)
"""

from __future__ import annotations

import base64
import io
import os
import shlex
import socket
import subprocess
import sys
import time
import traceback
from typing import Optional, Tuple, Union


def is_in_ci() -> bool:
    """True on a CI runner: SGLANG_IS_IN_CI (upstream's variable) or CI set to a true value."""
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes") for v in ("SGLANG_IS_IN_CI", "CI"))


def get_exception_traceback() -> str:
    """The traceback of the exception being handled, as text."""
    return "".join(traceback.format_exception(*sys.exc_info()))


def encode_image_base64(image: Union[str, bytes, "object"]) -> str:
    """An image as base64 text for a `data:image/...;base64,` URL or an `image_data` field.

    image: a file path, the file's bytes, or a PIL image (encoded as PNG). The bytes are sent as they are; the
    server decodes them (multimodal/image_loader.py).
    """
    if isinstance(image, str):
        with open(image, "rb") as f:
            data = f.read()
    elif isinstance(image, (bytes, bytearray, memoryview)):
        data = bytes(image)
    elif hasattr(image, "save"):  # a PIL image
        buf = io.BytesIO()
        image.save(buf, format="PNG")
        data = buf.getvalue()
    else:
        raise TypeError(f"encode_image_base64 takes a path, bytes or a PIL image, not {type(image).__name__}")
    return base64.b64encode(data).decode("ascii")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_server_cmd(command: str, host: str = "127.0.0.1", port: Optional[int] = None) -> Tuple[subprocess.Popen, int]:
    """Start `command` (a `python -m sglang.launch_server ...` or `sglang serve ...` line) on a free port (or
    `port`), unless the command names its own --port. Returns (process, port); the server's output goes to this
    process's stdout/stderr. Wait for it with wait_for_server, stop it with terminate_process."""
    args = shlex.split(command)
    if args and args[0] in ("python", "python3"):
        args[0] = sys.executable
    if "--port" in args:
        port = int(args[args.index("--port") + 1])
    else:
        port = port or _free_port()
        args += ["--port", str(port)]
    if "--host" not in args:
        args += ["--host", host]
    return subprocess.Popen(args), port


def wait_for_server(base_url: str, timeout: Optional[float] = None, api_key: Optional[str] = None) -> None:
    """Block until GET {base_url}/health answers 200. Raises TimeoutError after `timeout` seconds (None: wait on)."""
    import requests

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    start = time.perf_counter()
    while True:
        try:
            if requests.get(f"{base_url}/health", headers=headers, timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        if timeout is not None and time.perf_counter() - start > timeout:
            raise TimeoutError(f"The server at {base_url} did not answer /health within {timeout:.0f} s.")
        time.sleep(0.5)


def terminate_process(process: subprocess.Popen) -> None:
    """Stop a server started by launch_server_cmd (or any Popen) and everything it started."""
    from sglang.srt.utils import kill_process_tree

    kill_process_tree(process.pid)


def print_highlight(text: str) -> None:
    """Print text so it stands out in a notebook or terminal log."""
    print(f"\033[1;32m{text}\033[0m")

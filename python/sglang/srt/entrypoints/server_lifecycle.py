"""The server's lifetime: run uvicorn while watching the scheduler side (a ProcessGroup, srt/launch/), stop both.

Exit status (launch_server): 0 after SIGINT/SIGTERM; 1 when startup fails or a fatal error stops the server (a
scheduler process or TP rank died or reported a crash, the output loop failed), so a supervisor that restarts on
failure restarts it. In-flight requests get an error (a 500 body, or an error event then [DONE] on a stream) first.
The scheduler side never outlives this process (srt/launch/child.py), and the IPC directory of a server killed
without cleanup is removed by the next start (PortArgs.init_new).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from typing import TYPE_CHECKING

from sglang.srt.server_args import ServerArgs

if TYPE_CHECKING:  # the main process imports them after spawning the scheduler (http_server.py)
    from sglang.srt.launch.process_group import ProcessGroup
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

logger = logging.getLogger(__name__)

# how long uvicorn waits for open connections at a stop; with the scheduler's watch interval this keeps a fatal
# stop well under 5 s (in-flight requests are failed at once, so their connections close quickly)
GRACEFUL_SHUTDOWN_TIMEOUT_S = 3.0
SCHEDULER_WATCH_INTERVAL_S = 0.2
# bytes a connection may hold in this process beyond what the kernel's socket buffer took, before a response's
# writer waits (asyncio's default is 64 KiB). 0: a stream whose client reads slower than tokens arrive waits as soon
# as the kernel holds all it will take, and the token deltas that arrive meanwhile leave as one chunk (the
# TokenizerManager merges what is queued for a request) instead of one chunk per token queued in memory here
CONNECTION_WRITE_BUFFER_BYTES = 0


def http_protocol_class():
    """uvicorn's HTTP protocol (httptools when installed, else h11) with the write-buffer limit above, its received
    bytes parsed at read_pacing.ReadPacer's pace (one pacer for all connections of the server)."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    from sglang.srt.entrypoints.read_pacing import ReadPacer

    pacer = ReadPacer()

    class StreamingHTTPProtocol(AutoHTTPProtocol):
        paced_pending = 0  # chunks of this connection waiting in the pacer
        paced_paused = False  # its socket paused by the pacer

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            transport.set_write_buffer_limits(high=CONNECTION_WRITE_BUFFER_BYTES)

        def data_received(self, data: bytes) -> None:
            if pacer.offer(self, data):
                super().data_received(data)

        def parse_now(self, data: bytes) -> None:
            super().data_received(data)

    StreamingHTTPProtocol.pacer = pacer
    return StreamingHTTPProtocol


def check_port_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise SystemExit(f"Cannot bind {host}:{port} ({e.strerror}); pick another port with --port.") from None


async def serve(app, tm: TokenizerManager, schedulers: ProcessGroup, server_args: ServerArgs, started: float) -> None:
    import uvicorn

    config = uvicorn.Config(
        app,
        http=http_protocol_class(),
        host=server_args.host,
        port=server_args.port,
        log_level=server_args.log_level,
        access_log=server_args.log_level == "debug",
        timeout_keep_alive=5,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_TIMEOUT_S,
    )
    url = f"http://{server_args.host}:{server_args.port}"

    class AnnouncingServer(uvicorn.Server):
        def _log_started_message(self, listeners) -> None:
            # uvicorn calls this right after its listening sockets exist, before the event loop can answer a
            # request on them: the ready line is written (and flushed) before any /health can return 200, so a
            # caller that waits for /health and then reads our stdout always finds it
            super()._log_started_message(listeners)
            print(f"SGLang server ready at {url} (model: {tm.served_model_name}, "
                  f"startup {time.perf_counter() - started:.1f} s)", flush=True)

    server = AnnouncingServer(config)

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
            death = schedulers.death()
            if death is not None:
                tm.scheduler_died(death)
                return
            await asyncio.sleep(SCHEDULER_WATCH_INTERVAL_S)

    watcher = asyncio.ensure_future(watch())
    try:
        await server.serve()
    finally:
        watcher.cancel()


def raise_system_exit(signum, frame):
    raise SystemExit(0)

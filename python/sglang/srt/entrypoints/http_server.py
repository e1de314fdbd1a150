"""The HTTP server: launch_server() runs the whole thing; the FastAPI routes over a TokenizerManager are in
http_app.py, imported after the scheduler process is spawned (its start, the critical path of the ready time, then
overlaps with importing FastAPI, the OpenAI layer and the tokenizer in this process).

Process layout (like upstream):
    main process       uvicorn + FastAPI + TokenizerManager (tokenization, request state, SSE)
    scheduler process  Scheduler (model, KV pools, batching, detokenization), spawned, connected by ZMQ; with
                       --tp-size N also the follower ranks, with --dp-size N one per replica (srt/launch/)
The event loop of the main process never runs the model, so /health answers while a long batch runs.

launch_server() blocks until SIGINT/SIGTERM (exit 0), then stops uvicorn, aborts what is running and stops the
scheduler side; a fatal error (a scheduler process or rank died) stops it with exit status 1. Exit codes:
server_lifecycle.py; starting and stopping processes: srt/launch/; body size limit and API key: http_middleware.py.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time

from sglang.srt.entrypoints.server_lifecycle import check_port_free, raise_system_exit, serve
from sglang.srt.launch.scheduler_processes import start_scheduler_processes, wait_for_schedulers
from sglang.srt.managers.port_args import PortArgs
from sglang.srt.managers.tokenizer_loading import preload_tokenizer
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.gc_freeze import freeze_startup_heap
from sglang.srt.utils.startup_timing import process_age_s

logger = logging.getLogger(__name__)


def __getattr__(name: str):
    """create_app lives in http_app.py, imported lazily: the scheduler process is spawned before FastAPI loads."""
    if name == "create_app":
        from sglang.srt.entrypoints.http_app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ====================================================================== launch
def launch_server(server_args: ServerArgs) -> None:
    """Start the scheduler process and the HTTP server; return after a clean stop (SIGINT/SIGTERM).

    Exits with status 1 when startup fails or a fatal error stops the server (see server_lifecycle.py)."""
    started = time.perf_counter()
    imports_s = process_age_s()
    logging.basicConfig(
        level=server_args.log_level.upper(),
        format="[%(asctime)s] %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
    )
    if server_args.node_rank > 0:  # a follower node of a multi-node TP server: its ranks, no HTTP API
        from sglang.srt.launch.tp_ranks import run_follower_node

        sys.exit(run_follower_node(server_args))
    check_port_free(server_args.host, server_args.port)
    port_args = PortArgs.init_new()  # also removes IPC directories left by servers that died without cleanup
    schedulers = tm = None
    exit_code = 0
    # uvicorn re-raises the signal that stopped it; turn SIGTERM into SystemExit so the cleanup below runs
    signal.signal(signal.SIGTERM, raise_system_exit)
    try:
        schedulers = start_scheduler_processes(server_args, port_args)
        t_spawned = time.perf_counter()
        import sglang.srt.entrypoints.http_app  # noqa: F401 - FastAPI and the OpenAI layer, beside the model load

        # overlaps with the model load in the scheduler process(es); on a GGUF's first start, waits for its conversion
        preloaded = preload_tokenizer(server_args, lambda: schedulers.death() is None)

        t_tokenizer = time.perf_counter()
        info = wait_for_schedulers(schedulers, server_args)
        logger.info("Main process: imports %.2f s before launch, scheduler spawn %.2f s, API imports + tokenizer preload %.2f s "
                    "(beside the scheduler's start), then waited %.2f s for the scheduler", imports_s,
                    t_spawned - started, t_tokenizer - t_spawned, time.perf_counter() - t_tokenizer)
        from sglang.srt.entrypoints.http_app import create_app  # loaded while the scheduler started
        from sglang.srt.managers.tokenizer_manager import TokenizerManager

        tm = TokenizerManager(server_args, port_args, info, preloaded)
        app = create_app(tm)
        freeze_startup_heap()
        asyncio.run(serve(app, tm, schedulers, server_args, started))
    except KeyboardInterrupt:
        pass
    except SystemExit as e:  # SIGTERM (0), or uvicorn giving up (e.g. it could not bind)
        exit_code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except RuntimeError as e:  # the scheduler failed to start; its log says why
        logger.error("%s", e)
        exit_code = 1
    except Exception:  # noqa: BLE001 - anything else that stops the server is fatal too
        logger.exception("The server failed")
        exit_code = 1
    finally:
        if tm is not None:
            tm.close()
        if schedulers is not None:
            schedulers.stop()
        port_args.cleanup()
    if tm is not None and tm.fatal_error is not None:
        logger.error("The server stopped after a fatal error: %s", tm.fatal_error)
        exit_code = 1
    if exit_code:
        # Everything this process started is stopped and its IPC directory removed; skip the interpreter's
        # teardown (a full garbage collection of torch and transformers: seconds on a busy machine), so a
        # supervisor sees the failure at once.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_code)
    logger.info("Server stopped.")

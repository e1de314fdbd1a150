"""The scheduler's own process: it owns the model and the KV pools and serves the TokenizerManager over ZMQ.

    in  (PULL, pickled):  TokenizedGenerateReqInput | AbortReq | FlushCacheReq | GetInfoReq
    out (PUSH, pickled):  BatchReqOutput            one per step that produced tokens or finished requests
                          RpcReply(kind, payload)   kind in {"flush_cache", "server_info", "stats", "fatal"}

Loop: block on the input socket while idle, drain it without blocking while busy, then run one `step()`.
A request the scheduler can never serve comes back at once as a finished ReqOutput whose finish_reason carries
{"type": "abort", "message": ..., "status_code": 400}; a full waiting queue answers 503 the same way.
Faults inside a step fail only their requests (status_code 500, see fault_confinement.py) and the loop goes on;
the process stops (a "fatal" RpcReply, exit code 1) only when step() raises SchedulerStateCorrupt, i.e. the memory
bookkeeping could not be repaired, or on a bug in this loop itself.

It runs as a child of a process group (srt/launch/), which starts it, reports its failures and makes it die with
its parent. With --tp-size N this process is TP rank 0 (the only rank that schedules; srt/distributed/): SIGTERM
then only asks the loop to stop at its next step boundary, where it sends the other ranks "stop" (they are never
left inside a collective) and exits 0.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
import traceback
from typing import Any

import zmq

from sglang.srt.managers.io_struct import (
    AbortReq,
    BatchReqOutput,
    FlushCacheReq,
    GetInfoReq,
    ReqOutput,
    RpcReply,
    TokenizedGenerateReqInput,
)
from sglang.srt.managers.port_args import PortArgs
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.gc_freeze import freeze_startup_heap
from sglang.srt.utils.startup_timing import process_age_s

logger = logging.getLogger(__name__)

IDLE_POLL_TIMEOUT_MS = 1000  # wake up this often while idle (nothing else to do; the watchdog is a thread)
STATS_PUSH_INTERVAL_S = 0.5  # how often live stats are pushed to the metrics while busy
QUEUE_FULL_MESSAGE = "The request queue is full."


class SchedulerProcess:
    """Adapts a Scheduler (one step at a time, plain Python calls) to the ZMQ message protocol."""

    def __init__(self, scheduler: Any, server_args: ServerArgs, port_args: PortArgs):
        self.scheduler = scheduler
        self.server_args = server_args
        self.context = zmq.Context(2)
        self.recv_from_tokenizer = self.context.socket(zmq.PULL)
        self.recv_from_tokenizer.bind(port_args.scheduler_input_ipc_name)
        self.send_to_tokenizer = self.context.socket(zmq.PUSH)
        self.send_to_tokenizer.connect(port_args.tokenizer_ipc_name)
        self.last_stats_push = 0.0
        self.stop_requested = threading.Event()  # SIGTERM with tp > 1: stop at the next step boundary
        self.dp_rank = port_args.dp_rank  # stamped on every reply (data_parallel_controller.py)
        self.early_inputs: list = []  # read during a step's forward (overlap schedule), handled after the step
        if getattr(scheduler, "overlap", None) is not None:
            scheduler.overlap.window_hook = self.overlap_window

    # ------------------------------------------------------------------ input
    def recv_requests(self, block: bool) -> list:
        reqs = []
        if block and not self.recv_from_tokenizer.poll(IDLE_POLL_TIMEOUT_MS):
            return reqs
        while True:
            try:
                reqs.append(self.recv_from_tokenizer.recv_pyobj(zmq.NOBLOCK))
            except zmq.Again:
                return reqs

    def process_input(self, req) -> None:
        if isinstance(req, TokenizedGenerateReqInput):
            self.handle_generate(req)
        elif isinstance(req, AbortReq):
            self.scheduler.abort_request(req.rid)
        elif isinstance(req, FlushCacheReq):
            self.reply("flush_cache", bool(self.scheduler.flush_cache()))
        elif isinstance(req, GetInfoReq):
            self.reply("server_info", self.server_info())
        else:
            logger.error("Unknown message type %s", type(req).__name__)

    def handle_generate(self, req: TokenizedGenerateReqInput) -> None:
        max_queued = self.server_args.max_queued_requests
        if max_queued is not None and self.scheduler.get_stats().get("num_waiting_reqs", 0) >= max_queued:
            self.send_outputs([error_output(req, QUEUE_FULL_MESSAGE, 503)])
            return
        try:
            self.scheduler.add_request(req)
        except ValueError as e:
            self.send_outputs([error_output(req, str(e), 400)])
        except Exception as e:  # noqa: BLE001 - a request the scheduler cannot take fails alone
            logger.error("Could not queue request %s:\n%s", req.rid, traceback.format_exc())
            self.scheduler.reqs.pop(req.rid, None)
            self.send_outputs([error_output(req, f"The scheduler could not queue this request: "
                                                 f"{type(e).__name__}: {e}", 500)])

    def server_info(self) -> dict:
        info = dict(self.scheduler.get_server_info())
        info["internal_states"] = [self.scheduler.get_stats()]
        try:
            self.scheduler.check_integrity()
            info["memory_integrity"] = "ok"
        except AssertionError as e:
            info["memory_integrity"] = f"violated: {e}"
        return info

    # ------------------------------------------------------------------ output
    def send_outputs(self, outputs: list) -> None:
        if outputs:
            self.send_to_tokenizer.send_pyobj(BatchReqOutput(outputs))

    def reply(self, kind: str, payload: Any) -> None:
        self.send_to_tokenizer.send_pyobj(RpcReply(kind, payload, self.dp_rank))

    def maybe_push_stats(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.last_stats_push >= STATS_PUSH_INTERVAL_S:
            self.last_stats_push = now
            self.reply("stats", self.scheduler.get_stats())

    # ------------------------------------------------------------------ loop
    def overlap_window(self) -> None:
        """Called inside a step while its forward runs (overlap schedule): send the outputs ready so far and read
        the new messages; they are handled after the step (handling may finish requests the forward is using)."""
        outputs, self.scheduler.pending_outputs = self.scheduler.pending_outputs, []
        self.send_outputs(outputs)
        self.early_inputs.extend(self.recv_requests(block=False))

    def event_loop(self) -> None:
        busy = False
        while not self.stop_requested.is_set():
            inputs, self.early_inputs = self.early_inputs, []
            for req in inputs + self.recv_requests(block=not inputs and not self.scheduler.has_work()):
                self.process_input(req)
            if self.scheduler.has_work():
                busy = True
                self.send_outputs(self.scheduler.step())
                self.maybe_push_stats()
            elif busy:
                busy = False
                self.maybe_push_stats(force=True)
            else:
                self.scheduler.model_runner.ping_tp()  # idle (a poll timed out): are the other TP ranks there?


def error_output(req: TokenizedGenerateReqInput, message: str, status_code: int) -> ReqOutput:
    return ReqOutput(
        rid=req.rid,
        new_token_ids=[],
        new_text="",
        finished=True,
        finish_reason={"type": "abort", "message": message, "status_code": status_code},
        prompt_tokens=len(req.input_ids),
    )


def ready_info(scheduler: Any) -> dict:
    """What the main process needs before it can serve: the tokenizer's location and the scheduler's limits."""
    info = dict(scheduler.get_server_info())
    info["status"] = "ready"
    info["eos_token_ids"] = list(getattr(scheduler.model_config, "eos_token_ids", None) or [])
    return info


def log_startup_breakdown(scheduler: Any, t_imports: float, t_init: float, t_warmup: float) -> None:
    """One line saying where the scheduler's startup went (the ready time of `sglang serve` is mostly this)."""
    now = time.perf_counter()
    phases = dict(getattr(scheduler.model_runner, "startup_s", None) or {})
    runner_s = sum(phases.values())
    parts = [f"process start + imports {process_age_s() - (now - t_imports):.2f} s",
             f"scheduler imports {t_init - t_imports:.2f} s"]
    parts += [f"{name} {sec:.2f} s" for name, sec in phases.items()]
    source = getattr(scheduler.model_runner, "activation_peak_source", None)
    if source is not None and "memory_plan" in phases:
        parts[-1] += f" (activation peak {source()})"
    parts += [f"tokenizer + scheduler setup {t_warmup - t_init - runner_s:.2f} s", f"warmup {now - t_warmup:.2f} s"]
    logger.info("Scheduler ready %.2f s after its process started: %s", process_age_s(), ", ".join(parts))


def run_scheduler_process(server_args: ServerArgs, port_args: PortArgs, report) -> None:
    """Entry of the scheduler process (srt/launch/child.py runs it): report.ready(ready_info()) once it serves."""
    # SIGTERM from the parent: exit normally so atexit hooks release semaphores and sockets
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    t_imports = time.perf_counter()
    from sglang.srt.managers.scheduler import Scheduler

    t_init = time.perf_counter()
    scheduler = Scheduler(server_args)
    t_warmup = time.perf_counter()
    if not server_args.skip_server_warmup:
        scheduler.warmup()
    log_startup_breakdown(scheduler, t_imports, t_init, t_warmup)
    proc = SchedulerProcess(scheduler, server_args, port_args)
    freeze_startup_heap()
    if server_args.tp_size > 1:
        signal.signal(signal.SIGTERM, lambda signum, frame: proc.stop_requested.set())
    report.ready(ready_info(scheduler))
    try:
        proc.event_loop()
    except SystemExit:  # SIGTERM from the parent: a normal stop
        raise
    except BaseException as e:  # noqa: BLE001 - the TokenizerManager fails its requests with this message
        try:
            proc.reply("fatal", f"{type(e).__name__}: {e}")
            time.sleep(0.1)  # let the message leave before the process dies
        except Exception:  # noqa: BLE001 - the parent still learns the cause through the report pipe
            pass
        raise
    logger.info("Stop requested: releasing the other TP ranks")  # only reached on a requested stop (tp > 1)
    scheduler.model_runner.shutdown_tp()
    logger.info("TP ranks released")

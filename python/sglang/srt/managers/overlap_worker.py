"""Overlap schedule: the CPU work of step N's tokens runs while step N+1's forward runs.

A step appends each sampled token in two halves (schedule_batch.Req):
    token half  (append_token_id)  the id, grammar, stop tokens, max_new_tokens: at commit, as without overlap,
                                   because the next batch, its input ids, penalties and grammar masks need it;
    text half   (add_token_text)   detokenizing, stop strings, streamed outputs: with overlap, queued here and run
                                   on the window thread while the next forward + sampling runs on the scheduler thread
                                   (torch ops release the GIL).
The forward stays on the scheduler thread because OpenMP keeps one thread team per thread that starts parallel
regions: a second such thread (a forward thread beside the startup's team) puts more OpenMP threads than cores on a
small CPU, and libgomp then stops spinning between regions (its throttled spin count), so every kernel call pays a
futex wake-up: 2-8x slower small GEMMs on a 2-core machine, on both threads. The window thread runs Python only.
One-step lag: a stop string found in the window finishes its request after the forward is joined; if that request
was in the batch, its new token is dropped (kv_len does not advance, the slot is freed with the request), so the
tokens, text and prefix-cache contents are those of the schedule without overlap.
Invariants: at most one queued text entry per request (the window runs before the next commit); a request's queued
text is decoded before it finishes (OutputSink.flush_text); nothing in the window touches what the forward thread
reads (kv_len, output_ids, req_to_token, the grammar matcher), and requests are finished only after the join
(OutputSink.settle), so memory is never freed under a running forward.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Tuple

from sglang.srt.managers.fault_confinement import StepFault, step_phase
from sglang.srt.managers.schedule_batch import Req

if TYPE_CHECKING:
    from sglang.srt.managers.output_sink import OutputSink

logger = logging.getLogger(__name__)

# The overlap schedule's default per device: on only where it was measured to help. CPU (2-core x86, SmolLM2-135M
# Q4_1): the text half is ~0.07 ms of a 20-40 ms batch-1 step and ~0.4 ms of a 150 ms batch-32 step, and the forward's
# OpenMP threads already occupy every core: see benchmark/README.md for the A/B. GPUs: not measured yet.
OVERLAP_DEFAULT_BY_DEVICE = {"cpu": False}


def overlap_enabled(server_args, device: str) -> bool:
    """--enable-overlap-schedule / --disable-overlap-schedule, else the device's measured default (off when
    unmeasured). Never with tensor parallelism (ServerArgs refuses the flag there)."""
    if server_args.disable_overlap_schedule or server_args.tp_size > 1:
        return False
    if server_args.enable_overlap_schedule:
        if str(device) == "cpu":
            logger.info("--enable-overlap-schedule on CPU: off by default there (no measured gain on a 2-core "
                        "machine, benchmark/README.md).")
        return True
    return OVERLAP_DEFAULT_BY_DEVICE.get(str(device), False)


class OverlapSchedule:
    """Queued text halves and the window thread (OutputSink.overlap; None when off)."""

    def __init__(self, sink: "OutputSink"):
        self.sink = sink
        self.pending: Dict[int, Tuple[Req, int]] = {}  # id(req) -> (req, n_out): text not yet decoded
        # one thread runs the window's jobs (Python only: text halves, the process loop's messages), one at a time
        self.window = ThreadPoolExecutor(1, thread_name_prefix="overlap-window")
        self.window_hook: Optional[Callable[[], None]] = None  # more CPU work for the window (the process loop's)
        self.num_overlapped_steps = 0
        self.num_dropped_tokens = 0  # tokens computed for requests a window finished (one-step lag)

    def num_pending(self) -> int:
        return len(self.pending)

    # ------------------------------------------------------------------ text halves
    def defer(self, req: Req) -> None:
        assert id(req) not in self.pending, f"request {req.rid}: a second token before the first one's text"
        self.pending[id(req)] = (req, len(req.output_ids))

    def flush(self, req: Req) -> None:
        """Decode `req`'s queued text now (before it finishes; on the scheduler thread, outside a window)."""
        entry = self.pending.pop(id(req), None)
        if entry is not None:
            self.sink.decode_text(req, entry[1])

    def _drain(self) -> Tuple[List[Req], List[Tuple[Req, StepFault]]]:
        """Decode every queued text half; return the requests a stop string finished and the ones that faulted."""
        entries, self.pending = list(self.pending.values()), {}
        stopped, faulted = [], []
        for req, n_out in entries:
            try:
                with step_phase("detokenize"):
                    self.sink.decode_text(req, n_out)
            except StepFault as f:
                faulted.append((req, f))
                continue
            if req.finished():
                stopped.append(req)
        return stopped, faulted

    def drain_now(self) -> None:
        """No forward to overlap with: decode the queued text on the spot."""
        self.sink.settle(*self._drain())

    # ------------------------------------------------------------------ overlapped attempt
    def run(self, job: Callable):
        """Run `job` (forward + sampling of a batch, built already) on this thread while the window thread decodes
        the queued text and does the process loop's window work; settle the requests the text stopped, then return
        the job's result or raise its exception (the job's first, else the window's)."""
        window = self.window.submit(self._window)
        self.num_overlapped_steps += 1
        try:
            result = job()
        finally:
            settled, window_error = window.result()  # the window is over before anything else touches the batch
            if any(settled):
                self.sink.settle(*settled)
        if window_error is not None:
            raise window_error
        return result

    def _window(self):
        """On the window thread: (requests settled by the text halves, the window's exception or None); never raises."""
        settled: Tuple[list, list] = ([], [])
        try:
            settled = self._drain()
            if self.window_hook is not None:
                self.window_hook()
        except BaseException as e:  # noqa: BLE001 - raised on the scheduler thread after the join
            return settled, e
        return settled, None

    def shutdown(self) -> None:
        """End the window thread and wait for it (weakref.finalize runs this)."""
        self.window.shutdown(wait=True)

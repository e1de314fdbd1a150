"""Fault confinement: an exception inside a scheduler step fails only the requests it concerns.

Steps of a batch, and what a fault in each one does (batch_runner.py applies this):
    prefill / decode (the forward), sample     non-OOM: a batch of several requests is split in halves and each half
                                               retried, so a request-specific fault ends up failing that request alone;
                                               a batch of one fails its request.
                                               OOM: decode retracts part of the batch (decode_memory.py) and retries
                                               the rest; prefill splits the batch, then halves a lone request's chunk;
                                               only a request that does not fit even alone fails.
    detokenize                                 fails the one request.
    preparing a batch (admission, allocation)  fails the requests the batch had taken in.
Retrying is safe because a forward writes KV only into the slots allocated for its new tokens (the same slots on a
retry) and kv_len advances only after forward and sampling both succeeded.
A failed request finishes with {"type": "abort", "message": "The <step> step failed: ...", "status_code": 500}; its
KV and request slot are freed without caching. After a fault the scheduler checks its memory invariants and, if they
do not hold, rebuilds the free lists from the requests and the prefix cache; if they still do not hold it raises
SchedulerStateCorrupt. That and TpRankFailure (distributed/batch_sync.py: a TP forward failed, the ranks are out of
step) are the only exceptions that leave Scheduler.step() (FATAL_ERRORS).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Sequence

import torch

from sglang.srt.distributed.batch_sync import TpRankFailure

logger = logging.getLogger(__name__)

FAULT_STATUS_CODE = 500


class StepFault(Exception):
    """An exception raised in a named step of a batch (the original is `cause`)."""

    def __init__(self, step: str, cause: BaseException):
        super().__init__(f"{step}: {type(cause).__name__}: {cause}")
        self.step = step
        self.cause = cause


class SchedulerStateCorrupt(RuntimeError):
    """The KV / request-slot bookkeeping is inconsistent and could not be repaired: the scheduler must stop."""


# what leaves Scheduler.step (never confined to requests): broken bookkeeping, or TP ranks out of step
FATAL_ERRORS = (SchedulerStateCorrupt, TpRankFailure)


def is_oom(exc: BaseException) -> bool:
    return isinstance(exc, (torch.OutOfMemoryError, MemoryError))


@contextmanager
def step_phase(step: str):
    """Tag any exception raised inside with the step it happened in."""
    try:
        yield
    except (StepFault, *FATAL_ERRORS):
        raise
    except Exception as e:  # noqa: BLE001 - every fault of a batch is confined, whatever its type
        raise StepFault(step, e) from e


def fault_message(step: str, cause: BaseException) -> str:
    return f"The {step} step failed for this request: {type(cause).__name__}: {cause}"


def log_fault(what: str, cause: BaseException) -> None:
    logger.error("%s: %s: %s", what, type(cause).__name__, cause, exc_info=(type(cause), cause, cause.__traceback__))


class FaultPolicy:
    """The fault count and the test-only fault injector (fault_injection.py; None unless SGLANG_FAULT_INJECT is set),
    shared by the batch runner, the output sink (a finished request is forgotten) and Scheduler.step."""

    def __init__(self, faults=None):
        self.faults, self.num_faults = faults, 0

    def inject(self, step: str, reqs: Sequence, batch_no: int) -> None:
        if self.faults is not None:
            self.faults.check(step, [r.rid for r in reqs], batch_no)

    def forget(self, rid: str) -> None:
        if self.faults is not None:
            self.faults.forget(rid)

    def on_fault(self, what: str, cause: BaseException) -> None:
        """Log a fault with its traceback; the step that saw it checks (and repairs) memory afterwards."""
        log_fault(what, cause)
        self.num_faults += 1

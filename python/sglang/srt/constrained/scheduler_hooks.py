"""The scheduler's four calls into constrained decoding, kept here so scheduler.py stays about batching.

    build_backend(sched)          at startup: a GrammarBackend sized by the plan's request slots, or None
    hold_for_grammar(sched, req)  add_request: a request with a grammar waits for its compile (True), others don't
    admit_compiled(sched)         each step: compiled -> waiting queue; refused by xgrammar -> finished with a 400
    fill_ahead(sched, reqs)       before a decode forward: its grammar bitmask rows fill meanwhile (bitmask_fill.py)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from sglang.srt.constrained.grammar_check import check_request_grammar

if TYPE_CHECKING:
    from sglang.srt.constrained.backend import GrammarBackend

# With nothing else to run, a step waits at most this long for a compile (then returns, so new requests are read)
GRAMMAR_IDLE_WAIT_S = 0.005
INVALID_GRAMMAR_STATUS = 400


def build_backend(sched: Any) -> Optional["GrammarBackend"]:
    from sglang.srt.constrained.backend import build_grammar_backend

    backend = build_grammar_backend(sched.server_args, sched.tokenizer, sched.model_config.vocab_size,
                                    sched.model_config.eos_token_ids, sched.max_running_requests,
                                    device=sched.model_runner.device)
    plan = getattr(sched.model_runner, "memory_plan", None)
    if backend is not None and plan is not None:  # allocated == declared, on the plan's device
        assert backend.planned_bytes() == plan.bytes_of("grammar"), (backend.planned_bytes(), plan.term("grammar"))
    return backend


def hold_for_grammar(sched: Any, req: Any) -> bool:
    grammar = req.sampling_params.grammar
    if grammar is None:
        return False
    if sched.grammar_backend is None:  # the edge refuses these; a direct add_request gets the same answer
        try:
            check_request_grammar(grammar, "none")
        except ValueError as e:
            req.abort(str(e), status_code=INVALID_GRAMMAR_STATUS)
        sched.finish(req)
        return True
    sched.grammar_backend.hold(req)
    return True


def admit_compiled(sched: Any) -> None:
    backend = sched.grammar_backend
    if backend is None or not len(backend):
        return
    if not (sched.waiting_queue or sched.running or sched.chunked_req or sched.pending_outputs):
        backend.wait(GRAMMAR_IDLE_WAIT_S)  # only compiles in flight: block briefly instead of spinning
    ready, failed = backend.pop_ready()
    sched.waiting_queue.extend(ready)
    for req, message in failed:
        req.abort(message, status_code=INVALID_GRAMMAR_STATUS)
        sched.finish(req)


def fill_ahead(sched: Any, reqs: Any) -> None:
    if sched.grammar_backend is not None:
        sched.grammar_backend.filler.start(reqs)

"""GrammarGate: the scheduler's side of constrained decoding, kept here so the scheduler stays about batching.

    hold(req)          add_request: a request with a grammar waits for its compile (True), others don't
    admit_compiled()   each step: compiled -> the waiting queue; refused by the engine -> finished with a 400
    fill_ahead(reqs)   before a decode forward: its grammar bitmask rows fill meanwhile (bitmask_fill.py)
    bitmask            the batch runner masks the sampled logits with it
`backend` is None when structured output is off (--grammar-backend none).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from sglang.srt.constrained.grammar_check import check_request_grammar

if TYPE_CHECKING:
    from sglang.srt.constrained.backend import GrammarBackend

# With nothing else to run, a step waits at most this long for a compile (then returns, so new requests are read)
GRAMMAR_IDLE_WAIT_S = 0.005
INVALID_GRAMMAR_STATUS = 400


def build_backend(server_args: Any, tokenizer: Any, model_config: Any, max_running_requests: int,
                  model_runner: Any) -> Optional["GrammarBackend"]:
    """A GrammarBackend sized by the plan's request slots, or None."""
    from sglang.srt.constrained.backend import build_grammar_backend

    backend = build_grammar_backend(server_args, tokenizer, model_config.vocab_size, model_config.eos_token_ids,
                                    max_running_requests, device=model_runner.device)
    plan = getattr(model_runner, "memory_plan", None)
    if backend is not None and plan is not None:  # allocated == declared, on the plan's device
        assert backend.planned_bytes() == plan.bytes_of("grammar"), (backend.planned_bytes(), plan.term("grammar"))
    return backend


class GrammarGate:
    def __init__(self, backend: Optional["GrammarBackend"], queues: Any, sink: Any):
        self.backend = backend
        self.queues, self.sink = queues, sink  # compiled requests join the waiting queue; refused ones finish

    def __len__(self) -> int:
        """Requests waiting for a compile."""
        return len(self.backend) if self.backend is not None else 0

    @property
    def bitmask(self):
        return self.backend.bitmask if self.backend is not None else None

    def hold(self, req: Any) -> bool:
        grammar = req.sampling_params.grammar
        if grammar is None:
            return False
        if self.backend is None:  # the edge refuses these; a direct add_request gets the same answer
            try:
                check_request_grammar(grammar, "none")
            except ValueError as e:
                req.abort(str(e), status_code=INVALID_GRAMMAR_STATUS)
            self.sink.finish(req)
            return True
        self.backend.hold(req)
        return True

    def remove(self, req: Any) -> None:
        if self.backend is not None:
            self.backend.remove(req)

    def admit_compiled(self) -> None:
        if not len(self):
            return
        if not (self.queues.busy() or self.sink.pending_outputs):
            self.backend.wait(GRAMMAR_IDLE_WAIT_S)  # only compiles in flight: block briefly instead of spinning
        ready, failed = self.backend.pop_ready()
        self.queues.waiting.extend(ready)
        for req, message in failed:
            req.abort(message, status_code=INVALID_GRAMMAR_STATUS)
            req.finished_reason["param"] = req.sampling_params.grammar[0]  # the client's 400 names the field
            self.sink.finish(req)

    def fill_ahead(self, reqs: Any) -> None:
        if self.backend is not None:
            self.backend.filler.start(reqs)

    def stats(self) -> dict:
        return self.backend.stats() if self.backend is not None else {}

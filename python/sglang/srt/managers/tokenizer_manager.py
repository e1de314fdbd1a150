"""TokenizerManager: the main-process half of the server.

It turns API requests into TokenizedGenerateReqInput (chat template, tokenization, validation against the model's
limits; all of it off the event loop: chat_templating.py, request_tokenizer.py, offloop_executor.py), sends them to
the scheduler process over ZMQ, and routes the scheduler's per-step ReqOutput deltas to one
asyncio state per request id. Detokenization happens in the scheduler process, so the HTTP event loop only moves
small deltas. A request whose client goes away is aborted, which frees its KV memory in the scheduler.

Errors meant for the client are RequestError(status_code, message, param): the HTTP layer renders them OpenAI-style.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import time
from typing import Any, AsyncIterator, Callable, Dict, List, Optional

import zmq
import zmq.asyncio

from sglang.srt.managers.chat_templating import ChatTemplater
from sglang.srt.managers.data_parallel_controller import (
    DataParallelController,
    aggregate_stats,
    merge_server_info,
)
from sglang.srt.managers.request_kind import check_request_kind
from sglang.srt.managers.io_struct import (
    BatchReqOutput,
    FlushCacheReq,
    GetInfoReq,
    ReqOutput,
    RpcReply,
    TokenizedGenerateReqInput,
    new_rid,
)
from sglang.srt.managers.offloop_executor import OffLoopExecutor
from sglang.srt.managers.port_args import PortArgs
from sglang.srt.managers.req_state import ReqState, merge_outputs
from sglang.srt.managers.request_admission import ADMITTED_PER_THREAD, RequestAdmission, release_admission
from sglang.srt.managers.request_error import RequestError
from sglang.srt.managers.request_tokenizer import RequestTokenizer
from sglang.srt.managers.template_sandbox import TemplateSandbox
from sglang.srt.managers.tokenizer_loading import preload_tokenizer, served_model_name
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.chat_template_file import read_chat_template_file

__all__ = ["RequestError", "TokenizerManager", "preload_tokenizer", "served_model_name"]

logger = logging.getLogger(__name__)

DISCONNECT_POLL_INTERVAL_S = 1.0  # non-streaming requests check for a vanished client this often
HEALTH_GENERATE_TIMEOUT_S = 20.0
RPC_TIMEOUT_S = 60.0
HEALTH_CHECK_RID_PREFIX = "HEALTH_CHECK_"


class TokenizerManager:
    def __init__(self, server_args: ServerArgs, port_args: PortArgs, ready_info: dict, preloaded: Optional[tuple] = None):
        """`preloaded`: (tokenizer_path, tokenizer) loaded while the scheduler was starting; used if the path matches."""
        self.server_args = server_args
        self.ready_info = ready_info
        self.server_info: dict = dict(ready_info)
        self.context_len: int = ready_info["context_len"]
        self.vocab_size: int = ready_info["vocab_size"]
        # the scheduler's cap on prompt + output tokens (context length, or the KV pool if that is smaller)
        self.max_req_len: int = ready_info.get("max_req_len") or self.context_len
        self.max_req_input_len: int = ready_info.get("max_req_input_len") or self.max_req_len - 1
        self.model_path: str = ready_info.get("model_path") or server_args.model_path or ""
        self.tokenizer_path: str = ready_info.get("tokenizer_path") or self.model_path
        self.served_model_name = served_model_name(server_args, self.model_path)

        self.tokenizer = None
        if preloaded is not None and preloaded[0] == self.tokenizer_path:
            self.tokenizer = preloaded[1]
        elif not server_args.skip_tokenizer_init:
            from sglang.srt.utils.hf_transformers_utils import get_tokenizer

            self.tokenizer = get_tokenizer(self.tokenizer_path)

        # multimodal: images are decoded and preprocessed here, in the main process, off the scheduler
        from sglang.srt.multimodal.processors import get_mm_processor_for_dir

        self.mm_processor = get_mm_processor_for_dir(self.model_path, server_args)
        # the placeholder text the chat template puts where an item of each modality goes
        proc, tok = self.mm_processor, self.tokenizer
        holders = {m: proc.chat_placeholder(m, tok) for m in proc.supported_modalities} if proc and tok else {}
        self.mm_placeholders: Dict[str, str] = {m: text for m, text in holders.items() if text is not None}
        self.request_tokenizer = RequestTokenizer(
            self.tokenizer, self.mm_processor, self.vocab_size, self.context_len, self.max_req_len,
            self.max_req_input_len, grammar_backend=server_args.grammar_backend,
            enable_custom_logit_processor=server_args.enable_custom_logit_processor)
        self.offloop = OffLoopExecutor()
        self.admission = RequestAdmission(ADMITTED_PER_THREAD * self.offloop.num_threads)
        self.template_sandbox: Optional[TemplateSandbox] = None
        if server_args.allow_client_chat_template:
            self.template_sandbox = TemplateSandbox(
                server_args.client_chat_template_timeout_s,
                int(server_args.client_chat_template_max_output_mb * (1 << 20)),
            )
        server_template = read_chat_template_file(server_args.chat_template) if server_args.chat_template else None
        self.templater = ChatTemplater(self.tokenizer, self.offloop, self.template_sandbox, server_template)

        self.context = zmq.asyncio.Context(2)
        self.recv_from_scheduler = self.context.socket(zmq.PULL)
        self.recv_from_scheduler.bind(port_args.tokenizer_ipc_name)
        # one replica, or --dp-size N of them: requests go to one, aborts to its owner, control RPCs to all
        self.dispatcher = DataParallelController(self.context, port_args, server_args)

        self.start_time = time.time()
        self.rid_to_state: Dict[str, ReqState] = {}
        self.rpc_waiters: Dict[tuple, collections.deque] = collections.defaultdict(collections.deque)  # (kind, dp_rank)
        self.replica_stats: Dict[int, dict] = {}
        self.scheduler_stats: dict = {}  # all replicas together (aggregate_stats)
        self.last_receive_time = 0.0
        self.fatal_error: Optional[str] = None
        self.is_shutting_down = False
        self.on_fatal: Optional[Callable[[], None]] = None
        self.handle_loop_task: Optional[asyncio.Task] = None

        self.metrics = None
        if server_args.enable_metrics:
            from sglang.srt.metrics.collector import TokenizerMetricsCollector

            self.metrics = TokenizerMetricsCollector(self.served_model_name, ready_info)

    # ================================================================== lifecycle
    def start(self) -> None:
        """Start the output-routing loop; call from inside the running event loop."""
        if self.handle_loop_task is None:
            self.handle_loop_task = asyncio.get_running_loop().create_task(self.handle_loop())
            self.handle_loop_task.add_done_callback(self._handle_loop_done)
            if self.template_sandbox is not None:
                asyncio.get_running_loop().create_task(self.template_sandbox.prewarm())

    def _handle_loop_done(self, task: asyncio.Task) -> None:
        if task.cancelled():
            return
        e = task.exception()
        if e is not None:  # without this loop no output reaches any client: as fatal as a dead scheduler
            logger.error("The output loop failed", exc_info=e)
            self.scheduler_died(f"the output loop failed: {type(e).__name__}: {e}")

    def close(self) -> None:
        """Stop the helper threads and sandbox processes, and drop the sockets (at shutdown). Linger 0: messages
        for a scheduler that is gone would otherwise hold the process's exit."""
        self.offloop.shutdown()
        if self.template_sandbox is not None:
            self.template_sandbox.close()
        self.context.destroy(linger=0)

    @property
    def is_healthy(self) -> bool:
        return self.fatal_error is None and not self.is_shutting_down

    def scheduler_died(self, message: str) -> None:
        """Fail every pending request and every waiting RPC; the server cannot continue."""
        if self.fatal_error is not None:
            return
        self.fatal_error = message
        logger.error("Scheduler process failed: %s", message)
        for rid, state in list(self.rid_to_state.items()):
            state.pending.append(ReqOutput(
                rid=rid, new_token_ids=[], new_text="", finished=True,
                finish_reason={"type": "abort", "message": f"The scheduler failed: {message}", "status_code": 500},
            ))
            state.event.set()
        for waiters in self.rpc_waiters.values():
            while waiters:
                fut = waiters.popleft()
                if not fut.done():
                    fut.set_exception(RequestError(500, f"The scheduler failed: {message}"))
        if self.on_fatal is not None:
            self.on_fatal()

    # ================================================================== tokenization (off the event loop)
    async def apply_chat_template(
        self,
        messages: List[dict],
        tools: Optional[list] = None,
        continue_final_message: bool = False,
        template_kwargs: Optional[dict] = None,
    ) -> str:
        return await self.templater.apply(messages, tools, continue_final_message, template_kwargs)

    async def encode(self, text: str, add_special_tokens: bool = True) -> List[int]:
        return await self.offloop.run(self.request_tokenizer.encode, text, add_special_tokens)

    async def decode(self, ids: List[int], skip_special_tokens: bool = False) -> str:
        return await self.offloop.run(self.request_tokenizer.decode, ids, skip_special_tokens)

    @functools.lru_cache(maxsize=65536)
    def token_str(self, token_id: int) -> str:
        """The text of one token, for logprob listings."""
        if self.tokenizer is None:
            return str(token_id)
        return self.tokenizer.decode([token_id])

    async def tokenize_request(self, **kwargs: Any) -> TokenizedGenerateReqInput:
        """RequestTokenizer.tokenize_request on a pool thread (encoding, image decoding and preprocessing)."""
        return await self.offloop.run(self.request_tokenizer.tokenize_request, **kwargs)

    # ================================================================== generation
    async def generate_one(
        self, req: TokenizedGenerateReqInput, request: Any = None, stream: Optional[bool] = None
    ) -> AsyncIterator[ReqOutput]:
        """Send one request and yield its output deltas (merged when several arrived at once).

        Non-streaming: one merged ReqOutput at the end. A finish carrying a status_code raises RequestError.
        The request is aborted in the scheduler if the consumer stops early (client disconnect, cancellation).
        """
        if self.fatal_error is not None:
            raise RequestError(503, f"The server is not healthy: {self.fatal_error}")
        if self.is_shutting_down:
            raise RequestError(503, "The server is shutting down.")
        check_request_kind(req.is_embedding, self.server_args.is_embedding)  # embeddings xor generation
        stream = req.stream if stream is None else stream
        if req.rid in self.rid_to_state:
            raise RequestError(400, f"Duplicate request id {req.rid!r}.", param="rid")
        state = ReqState(metered=not req.rid.startswith(HEALTH_CHECK_RID_PREFIX))  # as upstream: probes uncounted
        state.last_time = state.created_time
        self.rid_to_state[req.rid] = state
        if self.server_args.log_requests:
            logger.info("rid=%s input_tokens=%d params=%s", req.rid, len(req.input_ids), req.sampling_params.to_dict())
        self.dispatcher.send_request(req)
        release_admission()  # this HTTP request's preparation is over: the next one may start its own
        collected: List[ReqOutput] = []
        try:
            while True:
                if request is not None and not stream:
                    try:
                        await asyncio.wait_for(state.event.wait(), DISCONNECT_POLL_INTERVAL_S)
                    except asyncio.TimeoutError:
                        if await request.is_disconnected():
                            logger.info("Client disconnected; aborting request %s", req.rid)
                            return
                        continue
                else:
                    await state.event.wait()
                outs, state.pending = state.pending, []
                state.event.clear()
                if not outs:
                    continue
                last = outs[-1]
                if last.finished and last.finish_reason and last.finish_reason.get("status_code"):
                    fr = last.finish_reason
                    raise RequestError(fr["status_code"], fr.get("message", "Request failed."), param=fr.get("param"))
                if stream:
                    yield merge_outputs(outs)
                else:
                    collected.extend(outs)
                if last.finished:
                    state.finished = True
                    if not stream:
                        yield merge_outputs(collected)
                    return
        finally:
            self.rid_to_state.pop(req.rid, None)
            if not state.finished:
                self.abort_request(req.rid)
                if self.metrics is not None and state.metered:
                    self.metrics.observe_abandoned(state, len(req.input_ids), time.perf_counter())

    async def generate_many(
        self, reqs: List[TokenizedGenerateReqInput], request: Any = None
    ) -> AsyncIterator[tuple]:
        """Run several requests at once; yield (index, ReqOutput delta) in arrival order."""
        if len(reqs) == 1:
            async for out in self.generate_one(reqs[0], request):
                yield 0, out
            return
        queue: asyncio.Queue = asyncio.Queue()
        done_marker = object()

        async def pump(i: int, req: TokenizedGenerateReqInput):
            try:
                async for out in self.generate_one(req, request):
                    queue.put_nowait((i, out))
            except BaseException as e:  # noqa: BLE001 - forwarded to the consumer
                queue.put_nowait((i, e))
            finally:
                queue.put_nowait((i, done_marker))

        tasks = [asyncio.ensure_future(pump(i, r)) for i, r in enumerate(reqs)]
        remaining = len(tasks)
        try:
            while remaining:
                i, item = await queue.get()
                if item is done_marker:
                    remaining -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield i, item
        finally:
            for t in tasks:
                if not t.done():
                    t.cancel()

    def abort_request(self, rid: str) -> None:
        if self.fatal_error is None:
            self.dispatcher.abort(rid)

    def abort_all(self) -> None:
        for rid in list(self.rid_to_state):
            self.abort_request(rid)

    # ================================================================== control RPCs
    async def rpc(self, req: Any, kind: str, timeout: float = RPC_TIMEOUT_S) -> List[Any]:
        """Send a control request to every replica; their payloads in dp_rank order."""
        if self.fatal_error is not None:
            raise RequestError(503, f"The server is not healthy: {self.fatal_error}")
        loop = asyncio.get_running_loop()
        futs = [loop.create_future() for _ in range(self.dispatcher.num_replicas)]
        for rank, fut in enumerate(futs):
            self.rpc_waiters[(kind, rank)].append(fut)
        self.dispatcher.broadcast(req)
        try:
            return list(await asyncio.wait_for(asyncio.gather(*futs), timeout))
        except asyncio.TimeoutError:
            raise RequestError(503, f"The scheduler did not answer {kind!r} within {timeout:.0f} s.") from None

    async def flush_cache(self) -> bool:
        return all(await self.rpc(FlushCacheReq(), "flush_cache"))

    async def get_server_info(self) -> dict:
        return merge_server_info(await self.rpc(GetInfoReq(), "server_info"), self.dispatcher)

    async def health_generate(self) -> bool:
        """True when the scheduler produces a token (or any output) within HEALTH_GENERATE_TIMEOUT_S."""
        start = time.perf_counter()
        req = TokenizedGenerateReqInput(
            rid=f"{HEALTH_CHECK_RID_PREFIX}{new_rid()}",
            input_text=None, input_ids=[0],
            sampling_params=SamplingParams.from_dict({"max_new_tokens": 1, "temperature": 0.0}),
            is_embedding=self.server_args.is_embedding,
        )

        async def run():
            async for _ in self.generate_one(req, stream=True):
                return

        task = asyncio.ensure_future(run())
        try:
            while time.perf_counter() - start < HEALTH_GENERATE_TIMEOUT_S:
                if task.done():
                    return task.exception() is None
                if self.last_receive_time > start:
                    return True
                await asyncio.sleep(0.05)
            return False
        finally:
            if not task.done():
                task.cancel()

    # ================================================================== output routing
    async def handle_loop(self) -> None:
        while True:
            obj = await self.recv_from_scheduler.recv_pyobj()
            self.last_receive_time = time.perf_counter()
            if isinstance(obj, BatchReqOutput):
                self.dispatch_outputs(obj.outputs)
            elif isinstance(obj, RpcReply):
                self.dispatch_reply(obj)
            else:
                logger.error("Unexpected message from the scheduler: %r", type(obj).__name__)

    def dispatch_outputs(self, outputs: List[ReqOutput]) -> None:
        now = self.last_receive_time
        for out in outputs:
            if out.finished:
                self.dispatcher.on_finished(out.rid)
            state = self.rid_to_state.get(out.rid)
            if state is None:
                continue  # aborted by its client; the scheduler's abort confirmation lands here
            if self.metrics is not None and state.metered:
                self.metrics.observe_output(state, out, now)
            state.pending.append(out)
            state.event.set()

    def dispatch_reply(self, reply: RpcReply) -> None:
        if reply.kind == "stats":
            self.replica_stats[reply.dp_rank] = reply.payload
            self.scheduler_stats = aggregate_stats(self.replica_stats)
            if self.metrics is not None:
                self.metrics.set_scheduler_stats(self.scheduler_stats)
            return
        if reply.kind == "fatal":
            prefix = f"data-parallel replica {reply.dp_rank}: " if self.dispatcher.num_replicas > 1 else ""
            self.scheduler_died(f"{prefix}{reply.payload}")
            return
        waiters = self.rpc_waiters.get((reply.kind, reply.dp_rank))
        while waiters:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(reply.payload)
                return

"""CUDA-graph decode: capture one graph per batch size in a bucket list, replay the smallest that holds the batch.

Which batches: decode only (one new token per request, no multimodal inputs), B <= G = the plan's
cuda_graph_max_bs. A batch of B requests is padded to P = padded_batch_size(B) (the next captured size); the
padded rows are dummy requests that
  * read request-table row 0 (ReqToTokenPool's dummy row, all zeros) with seq_len 1, so they attend to KV slot 0,
  * write their new K/V to KV slot 0, the first slot of the pool's dummy page that the allocator never hands out,
  * get token id 0 at position 0; their logits are computed and dropped.
So a padded replay touches nothing a live request owns, and the live rows' logits equal an eager forward's.

Static buffers (one set, sized by G, allocated once; each graph reads or writes views [:P] of them):
    input_ids, positions, req_pool_indices, seq_lens, out_cache_loc   int64 [G]
    logits                                                             fp32 [G, V], shared by every graph
The logits buffer is the largest graph's own output (captured first, so it lies in the graphs' pool); every smaller
graph P copies its forward's logits into logits[:P] and returns that view, so its own [P, V] result is a temporary
the pool reuses. The graphs hold G x V x 4 bytes of output whatever the number of sizes, as
mem_plan/sizes.cuda_graph_logits_bytes plans (one buffer per size held their sum: 2.57 GB for the 35 sizes up to
256 and a 152k vocabulary, against 0.156 GB).
A replay overwrites what the previous one returned; a caller consumes its logits before the next step (as with one
buffer per size, where consecutive batches of one size shared the buffer).
The attention backend's per-graph buffers (Triton split-KV workspace, FlashInfer fixed page tables) are planned and
allocated by the backend itself (mem_plan/backends.py, G rows).

Memory is a measured plan term: CudaGraphRunner.capture() reports the device memory the capture took (free memory
before and after, after emptying the allocator's cache, so it counts the graphs' private pool, the captured outputs
and the graph objects, not transient warm-up tensors). The model runner runs it twice: once in the measure phase on
scratch pools before the plan (the `cuda_graphs` term the plan charges, so the KV pool is sized around it) and once
after allocation (checked against the term by check_graph_memory(); an excess beyond the safety margin and headroom
stops startup naming --cuda-graph-max-bs / --disable-cuda-graph).

Graph factory: the thing that turns a callable into a replayable graph is injected. CudaGraphFactory uses
torch.cuda.CUDAGraph; EagerGraphFactory (tests, CPU) records each capture/replay and runs the callable eagerly,
copying its result into the captured output as a real replay overwrites it -- the padding, static-buffer and
dummy-slot logic is then the same code on a CPU.
"""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import torch

from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

logger = logging.getLogger(__name__)

# The padded rows' request-table row, KV slot, token id and position (see the module docstring)
DUMMY_REQ_ROW = 0
DUMMY_KV_SLOT = 0
DUMMY_TOKEN_ID = 0
DUMMY_SEQ_LEN = 1
# Warm-up forwards before each capture (kernel compilation, autotuning and lazy workspaces happen outside the graph)
NUM_WARMUP_FORWARDS = 2
# Capture buckets: 1, 2, 4, 8, then steps of 8 up to 256, of 16 up to 512 and of 32 beyond (upstream SGLang's shape
# of list: fine steps where decode batches are common, coarse ones where padding a large batch costs little).
BUCKET_SMALL = (1, 2, 4, 8)


def _bucket_step(bs: int) -> int:
    return 8 if bs < 256 else 16 if bs < 512 else 32


def capture_batch_sizes(max_bs: int) -> List[int]:
    """The decode batch sizes to capture for a largest graph batch of max_bs (max_bs itself always included)."""
    if max_bs <= 0:
        return []
    sizes = [s for s in BUCKET_SMALL if s <= max_bs]
    bs = BUCKET_SMALL[-1] + _bucket_step(BUCKET_SMALL[-1])
    while bs <= max_bs:
        sizes.append(bs)
        bs += _bucket_step(bs)
    if sizes[-1] != max_bs:
        sizes.append(max_bs)
    return sizes


def padded_batch_size(bs: int, captured: Sequence[int]) -> Optional[int]:
    """The smallest captured size >= bs (captured is sorted), or None when bs is larger than every graph."""
    i = bisect.bisect_left(captured, bs)
    return captured[i] if i < len(captured) else None


# ---------------------------------------------------------------------------------------------- static buffers
@dataclass
class StaticInputs:
    """The graphs' input tensors, int64 [G] each; graph P reads [:P]."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    out_cache_loc: torch.Tensor

    @classmethod
    def allocate(cls, max_bs: int, device) -> "StaticInputs":
        z = lambda: torch.zeros(max_bs, dtype=torch.int64, device=device)  # noqa: E731
        s = cls(z(), z(), z(), z(), z())
        s.fill_padding(0)
        return s

    def fill_padding(self, start: int, end: Optional[int] = None) -> None:
        """Rows [start, end) become dummy requests."""
        self.input_ids[start:end] = DUMMY_TOKEN_ID
        self.positions[start:end] = 0
        self.req_pool_indices[start:end] = DUMMY_REQ_ROW
        self.seq_lens[start:end] = DUMMY_SEQ_LEN
        self.out_cache_loc[start:end] = DUMMY_KV_SLOT

    def copy_batch(self, fb: ForwardBatch, padded_bs: int) -> None:
        """Rows [0, B) <- the live decode batch; rows [B, padded_bs) <- dummy requests."""
        bs = fb.batch_size
        self.input_ids[:bs].copy_(fb.input_ids)
        self.positions[:bs].copy_(fb.positions)
        self.req_pool_indices[:bs].copy_(fb.req_pool_indices)
        self.seq_lens[:bs].copy_(fb.seq_lens)
        self.out_cache_loc[:bs].copy_(fb.out_cache_loc)
        self.fill_padding(bs, padded_bs)

    def forward_batch(self, bs: int) -> ForwardBatch:
        """The decode ForwardBatch a graph of batch bs is captured with (views of the static buffers)."""
        return ForwardBatch(forward_mode=ForwardMode.DECODE, batch_size=bs, input_ids=self.input_ids[:bs],
                            positions=self.positions[:bs], req_pool_indices=self.req_pool_indices[:bs],
                            seq_lens=self.seq_lens[:bs], out_cache_loc=self.out_cache_loc[:bs])


def padded_seq_lens_cpu(seq_lens_cpu: Sequence[int], padded_bs: int) -> List[int]:
    return list(seq_lens_cpu) + [DUMMY_SEQ_LEN] * (padded_bs - len(seq_lens_cpu))


# ---------------------------------------------------------------------------------------------- graph factories
class CapturedGraph:
    """A torch.cuda.CUDAGraph and the output tensor its replay overwrites."""

    def __init__(self, graph, output: torch.Tensor):
        self.graph, self.output = graph, output

    def replay(self) -> torch.Tensor:
        self.graph.replay()
        return self.output


class CudaGraphFactory:
    """Real CUDA graphs, all captured into one private memory pool (largest batch first, so smaller graphs reuse its
    blocks)."""

    def __init__(self):
        self.pool = None

    def capture(self, fn: Callable[[], torch.Tensor], bs: int) -> CapturedGraph:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(NUM_WARMUP_FORWARDS):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            output = fn()
        torch.cuda.synchronize()
        return CapturedGraph(graph, output)


class EagerGraph:
    def __init__(self, factory: "EagerGraphFactory", fn: Callable[[], torch.Tensor], bs: int):
        self.factory, self.fn, self.bs = factory, fn, bs
        self.output = fn()

    def replay(self) -> torch.Tensor:
        self.factory.events.append(("replay", self.bs))
        self.output.copy_(self.fn())  # a real replay overwrites the captured output in place
        return self.output


class EagerGraphFactory:
    """Stand-in for CudaGraphFactory (tests, CPU): runs the callable eagerly and records ('capture' | 'replay', bs)."""

    def __init__(self):
        self.events: List[tuple] = []

    def capture(self, fn: Callable[[], torch.Tensor], bs: int) -> EagerGraph:
        for _ in range(NUM_WARMUP_FORWARDS):
            fn()
        self.events.append(("capture", bs))
        return EagerGraph(self, fn, bs)


# ---------------------------------------------------------------------------------------------- memory
def device_used_bytes(device: str) -> int:
    """Device memory in use by anyone, after returning the caching allocator's free blocks (CUDA); RSS (CPU)."""
    if str(device).startswith("cpu"):
        from sglang.srt.mem_plan.measure import cpu_current_rss_bytes, trim_cpu_heap

        trim_cpu_heap()
        return cpu_current_rss_bytes()
    from sglang.srt.mem_plan.measure import cuda_free_and_total_bytes

    torch.cuda.synchronize()
    free, total = cuda_free_and_total_bytes(torch.cuda.current_device())  # empties the cache first
    return total - free


@dataclass(frozen=True)
class GraphMemoryCheck:
    """The capture after allocation against the plan's cuda_graphs term."""

    planned_bytes: int
    measured_bytes: int
    slack_bytes: int  # what may absorb an excess: the plan's safety margin + headroom

    @property
    def excess_bytes(self) -> int:
        return max(self.measured_bytes - self.planned_bytes, 0)

    @property
    def fits(self) -> bool:
        return self.excess_bytes <= self.slack_bytes


def check_graph_memory(planned_bytes: int, measured_bytes: int, slack_bytes: int) -> GraphMemoryCheck:
    return GraphMemoryCheck(planned_bytes, measured_bytes, slack_bytes)


def graph_memory_error(check: GraphMemoryCheck, max_bs: int) -> str:
    gib = 2**30
    return (f"CUDA graphs took {check.measured_bytes / gib:.3f} GiB after the KV pool was allocated, but the plan "
            f"reserved {check.planned_bytes / gib:.3f} GiB (measured on scratch pools before planning) and its "
            f"safety margin and headroom absorb only {check.slack_bytes / gib:.3f} GiB. Lower --cuda-graph-max-bs "
            f"(now {max_bs}) or pass --disable-cuda-graph.")


# ---------------------------------------------------------------------------------------------- the runner
@dataclass
class CaptureReport:
    batch_sizes: List[int]
    measured_bytes: int
    events: List[tuple] = field(default_factory=list)
    output_bytes: int = 0  # what the graphs' outputs hold: the shared fp32 [G, V] logits


class CudaGraphRunner:
    """Captures decode graphs for `capture_batch_sizes(max_bs)` over a model, its pools and its attention backend,
    and replays them for decode batches of up to max_bs requests.

    model_forward(input_ids, positions, forward_batch) -> fp32 logits [B, V]; the forward batch it receives carries
    the pools and the backend (set here). The backend must implement init_forward_metadata_capture_cuda_graph and
    init_forward_metadata_replay_cuda_graph (Triton, FlashInfer)."""

    def __init__(self, model_forward: Callable, attn_backend, req_to_token_pool, token_to_kv_pool, max_bs: int,
                 device, factory):
        if max_bs <= 0:
            raise ValueError(f"CudaGraphRunner needs a graph batch size >= 1, got {max_bs}")
        if not hasattr(attn_backend, "init_forward_metadata_capture_cuda_graph"):
            raise ValueError(f"--attention-backend {attn_backend.backend_name} has no CUDA-graph decode path")
        self.model_forward, self.attn_backend = model_forward, attn_backend
        self.req_to_token_pool, self.token_to_kv_pool = req_to_token_pool, token_to_kv_pool
        self.max_bs, self.device, self.factory = max_bs, device, factory
        self.batch_sizes = capture_batch_sizes(max_bs)
        self.static = StaticInputs.allocate(max_bs, device)
        self.graphs: Dict[int, object] = {}
        self.logits: Optional[torch.Tensor] = None  # fp32 [G, V]: the largest graph's output, shared (docstring)
        self.num_replays = 0

    def _static_batch(self, bs: int) -> ForwardBatch:
        fb = self.static.forward_batch(bs)
        fb.req_to_token_pool, fb.token_to_kv_pool, fb.attn_backend = (self.req_to_token_pool, self.token_to_kv_pool,
                                                                      self.attn_backend)
        return fb

    @torch.inference_mode()
    def capture(self) -> CaptureReport:
        """Capture every bucket (largest first) and measure the device memory it took."""
        self.static.fill_padding(0)
        before = device_used_bytes(self.device)
        for bs in reversed(self.batch_sizes):
            fb = self._static_batch(bs)
            self.attn_backend.init_forward_metadata_capture_cuda_graph(bs, fb.req_pool_indices,
                                                                      [DUMMY_SEQ_LEN] * bs,
                                                                      rows_cpu=[DUMMY_REQ_ROW] * bs)
            self.graphs[bs] = self.factory.capture(lambda fb=fb, bs=bs: self._forward(fb, bs), bs)
            if bs == self.max_bs:
                self.logits = self.graphs[bs].output
        measured = max(device_used_bytes(self.device) - before, 0)
        logger.info("Captured CUDA graphs for decode batch sizes %s: %.1f MiB (their shared logits %.1f MiB)",
                    self.batch_sizes, measured / 2**20, self.output_bytes() / 2**20)
        return CaptureReport(list(self.batch_sizes), measured, list(getattr(self.factory, "events", [])),
                             self.output_bytes())

    def _forward(self, fb: ForwardBatch, bs: int) -> torch.Tensor:
        """The captured callable of graph bs: its logits, in the shared buffer for every graph but the largest (whose
        output the buffer is)."""
        logits = self.model_forward(fb.input_ids, fb.positions, fb)
        if bs == self.max_bs:
            return logits
        out = self.logits[:bs]
        out.copy_(logits)
        return out

    def output_bytes(self) -> int:
        """Bytes the captured graphs' outputs hold, each distinct storage once (what the plan's logits part sizes)."""
        held = {g.output.untyped_storage().data_ptr(): g.output.untyped_storage().nbytes() for g in self.graphs.values()}
        return sum(held.values())

    def can_run(self, fb: ForwardBatch) -> bool:
        return (fb.forward_mode.is_decode() and fb.batch_size <= self.max_bs and fb.mm_inputs is None
                and fb.mrope_positions is None and bool(self.graphs))

    @torch.inference_mode()
    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        """Logits fp32 [B, V] of a decode batch (B <= max_bs), from the graph of the next captured size."""
        bs = fb.batch_size
        padded = padded_batch_size(bs, self.batch_sizes)
        self.static.copy_batch(fb, padded)
        seq_lens_cpu = fb.seq_lens_cpu or fb.seq_lens.tolist()
        rows_cpu = list(fb.req_pool_indices_cpu) + [DUMMY_REQ_ROW] * (padded - bs) if fb.req_pool_indices_cpu else None
        self.attn_backend.init_forward_metadata_replay_cuda_graph(
            padded, self.static.req_pool_indices[:padded], padded_seq_lens_cpu(seq_lens_cpu, padded),
            rows_cpu=rows_cpu)
        logits = self.graphs[padded].replay()
        self.num_replays += 1
        return logits[:bs]

"""ServerArgs value checks (ServerArgs.validate calls check_values): positive numbers, the parallelism layout, the
request-body limit and its two spellings. Every message names the flag and what to change. Takes the ServerArgs
instance (no import of server_args, so the two never import each other)."""

from __future__ import annotations

import dataclasses
import json

from sglang.srt.mem_plan.inputs import check_mem_fraction_static

# Why --enable-dp-attention is refused (the flag exists so that upstream's command lines get this answer, not "unknown
# argument"): it splits one TP group's batch across ranks around attention, and this runtime's TP ranks run the batch
# rank 0 schedules, in lockstep, with no per-rank batches to gather at the MoE layers and scatter back after them.
DP_ATTENTION_REFUSAL = (
    "--enable-dp-attention is not supported: this runtime's tensor-parallel ranks run one batch, scheduled by rank 0, "
    "in lockstep, so attention cannot take per-rank batches that the MoE layers gather and scatter. An MLA model "
    "(DeepSeek V2/V3, Kimi-K2) at --tp-size N keeps its latent KV cache replicated on every rank instead (the plan "
    "counts it so); for independent replicas use --dp-size. Drop --enable-dp-attention.")

MIB_BYTES = 1 << 20
# Why decode CUDA graphs are off with --tp-size > 1 (mem_plan/build.resolve_cuda_graph_max_bs resolves them to 0
# there; an explicit --cuda-graph-max-bs is refused with this). The TP collectives inside the forward (the MoE and
# row-parallel all-reduce, the logits all-gather: distributed/communication_op.py) are plain torch.distributed NCCL
# calls, and no run has shown them captured and replayed in a graph; upstream SGLang captures instead through its
# own communicators in graph mode (custom all-reduce, pynccl).
CUDA_GRAPHS_WITH_TP = ("decode CUDA graphs are not captured with --tp-size > 1: the tensor-parallel collectives in "
                       "the forward are plain torch.distributed (NCCL) calls, not a communicator shown to be "
                       "captured and replayed in a graph, so with --tp-size > 1 decode runs eagerly")


def request_body_limit(a) -> tuple:
    """(bytes, flag): --max-payload-size (upstream's, in bytes) when given, else --max-request-body-mb in MiB."""
    if a.max_payload_size is not None:
        return a.max_payload_size, "--max-payload-size"
    return int(a.max_request_body_mb * MIB_BYTES), "--max-request-body-mb"


def check_request_body_flags(a) -> None:
    if a.max_payload_size is None:
        return
    if type(a.max_payload_size) is not int or a.max_payload_size <= 0:
        raise ValueError(f"--max-payload-size must be a positive number of bytes, got {a.max_payload_size!r}.")
    mb_bytes = int(a.max_request_body_mb * MIB_BYTES)
    # --max-request-body-mb counts as given when it is not its default (ServerArgs holds the one default)
    mb_default = {f.name: f.default for f in dataclasses.fields(a)}["max_request_body_mb"]
    if a.max_request_body_mb != mb_default and mb_bytes != a.max_payload_size:
        raise ValueError(f"--max-payload-size {a.max_payload_size} (bytes) and --max-request-body-mb "
                         f"{a.max_request_body_mb:g} ({mb_bytes} bytes) set different request-body limits; give one "
                         "of the two (--max-payload-size is upstream's spelling of --max-request-body-mb, in bytes).")


def mm_item_limits(value, modalities) -> dict:
    """--limit-mm-data-per-request (JSON text or None) as {modality: max items}."""
    if value is None:
        return {}
    try:
        limits = json.loads(value)
    except ValueError:
        limits = None
    if not isinstance(limits, dict) or any(k not in modalities or type(v) is not int or v < 0
                                           for k, v in limits.items()):
        raise ValueError(f"--limit-mm-data-per-request {value!r}: give a JSON object "
                         f"of modality -> non-negative item count, modalities from {', '.join(modalities)}, "
                         'e.g. \'{"image": 8, "video": 1}\'.')
    return limits


def check_values(a) -> None:
    def positive(name: str, allow_none: bool = True):
        v = getattr(a, name)
        if v is None and allow_none:
            return
        if v is None or v <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be a positive number, got {v!r}.")

    for name in ("max_request_body_mb", "client_chat_template_timeout_s", "client_chat_template_max_output_mb"):
        positive(name, allow_none=False)
    if a.chat_template is not None:  # read and rendered once here, so a bad file stops the launch
        from sglang.srt.utils.chat_template_file import check_chat_template_file

        check_chat_template_file(a.chat_template)
    for name in ("context_length", "max_running_requests", "max_total_tokens", "max_queued_requests",
                 "cuda_graph_max_bs", "max_image_pixels", "num_threads", "max_total_memory_gb"):
        positive(name)
    for name in ("page_size", "max_prefill_tokens", "stream_interval", "tp_size", "ep_size", "pp_size",
                 "encoder_batch_size", "decode_log_interval"):
        positive(name, allow_none=False)
    if a.tp_size % a.ep_size:
        # the expert groups are made of TP ranks (distributed/parallel_state.moe_parallel_layout)
        raise ValueError(f"--ep-size {a.ep_size} must divide --tp-size {a.tp_size}: the experts are split "
                         f"over groups of the TP ranks; use --tp-size {a.ep_size} --ep-size {a.ep_size} "
                         f"(every rank holds 1/{a.ep_size} of the experts), or a divisor of {a.tp_size}.")
    check_mem_fraction_static(a.mem_fraction_static)
    if a.chunked_prefill_size is not None and a.chunked_prefill_size != -1 and a.chunked_prefill_size <= 0:
        raise ValueError("--chunked-prefill-size must be positive, or -1 to disable chunking.")
    if a.schedule_conservativeness <= 0:
        raise ValueError("--schedule-conservativeness must be positive.")
    if a.enable_overlap_schedule and a.disable_overlap_schedule:
        raise ValueError("--enable-overlap-schedule and --disable-overlap-schedule contradict; pass one.")
    if a.tp_size > 1 and a.cuda_graph_max_bs is not None and not a.disable_cuda_graph:
        raise ValueError(f"--cuda-graph-max-bs {a.cuda_graph_max_bs} with --tp-size {a.tp_size}: {CUDA_GRAPHS_WITH_TP}. "
                         "Drop --cuda-graph-max-bs (or pass --disable-cuda-graph), or use --tp-size 1 to keep "
                         "the graphs.")
    if a.enable_overlap_schedule and a.tp_size > 1:
        raise ValueError("--enable-overlap-schedule with --tp-size > 1 is not supported (the TP collectives run "
                         "on the scheduler thread); drop one of the two.")
    a.mm_item_limits()  # raises on a malformed --limit-mm-data-per-request
    if a.max_video_frames <= 0 or a.max_audio_seconds <= 0:
        raise ValueError(f"--max-video-frames ({a.max_video_frames}) and --max-audio-seconds "
                         f"({a.max_audio_seconds}) must be positive.")
    if a.encoder_mem_reserve is not None and a.encoder_mem_reserve < 0:
        raise ValueError("--encoder-mem-reserve must be >= 0 (GiB).")
    if a.pp_size != 1:
        raise ValueError(f"--pp-size {a.pp_size}: pipeline parallelism is not supported; use 1 (and --tp-size).")
    if a.nnodes < 1 or not (0 <= a.node_rank < a.nnodes) or a.tp_size % a.nnodes:
        raise ValueError(f"--nnodes {a.nnodes} / --node-rank {a.node_rank}: need 0 <= node-rank < nnodes "
                         f"and nnodes dividing --tp-size {a.tp_size}.")
    if a.nnodes > 1 and not a.dist_init_addr:
        raise ValueError("--nnodes > 1 needs --dist-init-addr host:port (node 0's address, the same on every node).")
    if a.dp_size < 1:
        raise ValueError(f"--dp-size must be a positive number, got {a.dp_size!r}.")
    if a.dp_size > 1 and (a.tp_size > 1 or a.nnodes > 1):
        raise ValueError(f"--dp-size {a.dp_size} with --tp-size {a.tp_size} / --nnodes {a.nnodes}: "
                         "data parallelism runs single-rank replicas on one node; use --tp-size 1 --nnodes 1, or "
                         "run one server per TP group behind sglang-router (docs/router.md).")
    if a.dist_init_addr is not None and not a.dist_init_addr.rpartition(":")[2].isdigit():
        raise ValueError(f"--dist-init-addr {a.dist_init_addr!r}: use host:port.")
    if not (0 < a.port < 65536):
        raise ValueError(f"--port must be in 1..65535, got {a.port}.")
    check_request_body_flags(a)

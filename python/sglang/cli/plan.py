"""`sglang plan`: a memory-plan dry run -- no GPU, no weights.

Weight bytes are counted from config.json (mem_plan.model_shapes), the activation term comes from a declared
formula, the attention workspace from the same declarations the server's backends allocate (mem_plan.backends),
and the budget from a GPU preset (mem_plan.gpu_presets). Prints the plan, whether it fits, what limits it and
what to change; --json prints the same as one JSON object. Exit status: 0 fits, 1 does not fit.

    sglang plan --model-path meta-llama/Llama-3.1-8B --gpu h100-80gb [--tp 2] [--json]
    python -m sglang.cli.plan --model-path config.json --gpu mi355x --attention-backend aiter
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Optional

from sglang.srt.mem_plan import MemoryPlan, MemoryPlanError, PlanInputs, plan_memory
from sglang.srt.mem_plan.backends import ATTENTION_BACKENDS, workspace_spec
from sglang.srt.mem_plan.encoder import encoder_reservation_bytes
from sglang.srt.mem_plan.gpu_presets import GPU_PRESETS, get_gpu_preset
from sglang.srt.mem_plan.model_shapes import model_shape_from_path
from sglang.srt.mem_plan.slots import SlotRule
from sglang.srt.mem_plan.specs import KV_DTYPE_BYTES, req_to_token_bytes
from sglang.srt.mem_plan.tiers import tier_defaults, upstream_mem_fraction
from sglang.srt.mem_plan.units import GiB, MiB, gib

# Declared CUDA-graph term for the dry run: upstream's reserve of 2 MiB per captured decode batch size.
CUDA_GRAPH_BYTES_PER_BS = 2 * MiB
# The runner keeps req_to_token as int64 on the host side of the contract; plan the same.
REQ_TO_TOKEN_ELEM_BYTES = 8
# Upstream's req_to_token is int32.
UPSTREAM_REQ_TO_TOKEN_ELEM_BYTES = 4
# A hint is printed for a non-KV term above this share of the budget.
HINT_TERM_SHARE = 0.10
# The server's --mm-embedding-cache-mb default (ServerArgs), charged for models with encoders.
MM_EMBEDDING_CACHE_MB_DEFAULT = 100


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sglang plan", description="Plan device memory without a GPU or weights.")
    p.add_argument("--model-path", required=True, help="Model directory with config.json, or a config .json file.")
    p.add_argument("--gpu", required=True, help=f"GPU preset: {', '.join(GPU_PRESETS)}.")
    p.add_argument("--tp", "--tp-size", dest="tp", type=int, default=1, help="Tensor parallel size.")
    p.add_argument("--context-length", type=int, default=None, help="Default: max_position_embeddings.")
    p.add_argument("--attention-backend", choices=ATTENTION_BACKENDS, default=None,
                   help="Default: aiter on AMD presets, flashinfer on NVIDIA presets.")
    p.add_argument("--kv-cache-dtype", default="auto", choices=["auto"] + sorted(KV_DTYPE_BYTES))
    p.add_argument("--mem-fraction-static", type=float, default=None, help="Default: auto (solved).")
    p.add_argument("--max-running-requests", type=int, default=None)
    p.add_argument("--max-total-tokens", type=int, default=None)
    p.add_argument("--max-total-memory-gb", type=float, default=None, help="Absolute cap in GiB.")
    p.add_argument("--chunked-prefill-size", type=int, default=None, help="Default: the GPU tier's value.")
    p.add_argument("--cuda-graph-max-bs", type=int, default=None, help="Default: the GPU tier's value.")
    p.add_argument("--disable-cuda-graph", action="store_true")
    p.add_argument("--page-size", type=int, default=1)
    p.add_argument("--encoder-mem-reserve", type=float, default=None,
                   help="GiB for multimodal encoders. Default: computed from the encoder specs.")
    p.add_argument("--encoder-batch-size", type=int, default=1)
    p.add_argument("--mm-embedding-cache-mb", type=int, default=None,
                   help="Image-embedding cache budget (MiB). Default: the server's 100 for models with encoders, else 0.")
    p.add_argument("--json", action="store_true", help="Print one JSON object.")
    return p


def _inputs(args, shape, gpu) -> tuple[PlanInputs, dict]:
    tp = args.tp
    context_len = args.context_length or shape.text.max_position_embeddings
    backend = args.attention_backend or gpu.default_attention_backend
    tier_chunk, tier_graph_bs = tier_defaults(gpu.memory_total_mib, tp)
    chunk = args.chunked_prefill_size or tier_chunk
    graph_bs = 0 if args.disable_cuda_graph else (args.cuda_graph_max_bs or tier_graph_bs)
    cell = shape.kv_cell(args.kv_cache_dtype, tp)
    inputs = PlanInputs(
        pre_load_free_bytes=gpu.pre_load_free_bytes,
        weight_bytes=shape.weight_bytes(tp),
        kv_cell_bytes=cell.cell_bytes,
        context_len=context_len,
        page_size=args.page_size,
        mem_fraction_static=args.mem_fraction_static,
        max_running_requests=args.max_running_requests,
        max_total_tokens=args.max_total_tokens,
        cap_bytes=None if args.max_total_memory_gb is None else int(args.max_total_memory_gb * GiB),
        chunked_prefill_size=chunk,
        activation_bytes=shape.activation_bytes(chunk if chunk > 0 else context_len, tp),
        workspace=workspace_spec(backend, shape.attention_shape(context_len, tp)),
        req_to_token_elem_bytes=REQ_TO_TOKEN_ELEM_BYTES,
        logits_per_req_bytes=shape.logits_per_req_bytes(),
        cuda_graph_bytes=graph_bs * CUDA_GRAPH_BYTES_PER_BS,
        cuda_graph_max_bs=graph_bs,
        encoder_bytes=sum(encoder_reservation_bytes(e, args.encoder_batch_size) for e in shape.encoders)
        if args.encoder_mem_reserve is None else encoder_reservation_bytes(None, 1, args.encoder_mem_reserve),
        encoder_detail=_encoder_detail(args, shape),
        mm_cache_bytes=_mm_cache_mb(args, shape) * MiB,
        device_total_bytes=gpu.memory_total_bytes,
        tp_size=tp,
        sources={"weights": "formula", "activations": "formula", "cuda_graphs": "formula",
                 "encoder": "declared"},
    )
    context = {"context_len": context_len, "attention_backend": backend, "kv_cell": cell}
    return inputs, context


def _mm_cache_mb(args, shape) -> int:
    if args.mm_embedding_cache_mb is not None:
        return args.mm_embedding_cache_mb
    return MM_EMBEDDING_CACHE_MB_DEFAULT if shape.encoders else 0


def _encoder_detail(args, shape) -> str:
    if args.encoder_mem_reserve is not None:
        return "--encoder-mem-reserve"
    return "; ".join(f"{e.name}: {e.max_tokens_per_input:,} tokens x batch {args.encoder_batch_size}"
                     for e in shape.encoders)


def encoder_effect(plan: MemoryPlan, inputs: PlanInputs) -> Optional[dict]:
    """What the encoder reservation and the embedding cache cost the KV pool: the same plan without them."""
    reserved = inputs.encoder_bytes + inputs.mm_cache_bytes
    if reserved == 0:
        return None
    try:
        without = plan_memory(dataclasses.replace(inputs, encoder_bytes=0, mm_cache_bytes=0))
    except MemoryPlanError:
        return None
    return {"reserved_bytes": reserved, "kv_tokens_with": plan.max_total_num_tokens,
            "kv_tokens_without": without.max_total_num_tokens,
            "kv_tokens_lost": without.max_total_num_tokens - plan.max_total_num_tokens}


def upstream_comparison(inputs: PlanInputs, backend: str, gpu) -> dict:
    """What upstream's classic formula would do on the same inputs: y from the tier reserve (AITER-derated),
    KV = y * pre - weights, and everything else left to the unplanned (1 - y) * pre slack."""
    y = inputs.mem_fraction_static or upstream_mem_fraction(
        gpu.memory_total_mib, backend, inputs.context_len, tp_size=inputs.tp_size,
        chunked_prefill_size=inputs.chunked_prefill_size)
    pre = inputs.pre_load_free_bytes
    kv_room = int(y * pre) - inputs.weight_bytes
    tokens = max(kv_room, 0) // inputs.kv_cell_bytes // inputs.page_size * inputs.page_size
    slots = SlotRule(inputs.context_len, inputs.max_running_requests).slots(tokens)
    graph_bs = min(inputs.cuda_graph_max_bs or 0, slots)
    runtime = (inputs.workspace.bytes_for(slots, graph_bs)
               + req_to_token_bytes(slots, inputs.context_len, UPSTREAM_REQ_TO_TOKEN_ELEM_BYTES)
               + inputs.activation_bytes + inputs.logits_per_req_bytes * slots + inputs.cuda_graph_bytes
               + inputs.encoder_bytes)
    slack = pre - int(y * pre)
    return {"mem_fraction_static": y, "max_total_num_tokens": tokens, "max_running_requests": slots,
            "slack_bytes": slack, "unplanned_runtime_bytes": runtime, "slack_left_bytes": slack - runtime,
            "starts": kv_room > 0}


def hints(plan: MemoryPlan, inputs: PlanInputs, kv_cache_dtype: str) -> list[str]:
    out = []
    if plan.max_total_num_tokens < plan.context_len:
        out.append(f"The KV pool holds {plan.max_total_num_tokens:,} tokens, less than one full-context request: "
                   f"use --context-length {plan.max_total_num_tokens // 2:,} or less, more --tp, or fp8 KV.")
    for name in ("attention_workspace", "req_to_token", "logits", "encoder", "activations"):
        t = plan.term(name)
        if t.num_bytes > HINT_TERM_SHARE * plan.budget_bytes:
            if name in ("attention_workspace", "req_to_token", "logits") and inputs.max_running_requests is None:
                out.append(f"{name} takes {gib(t.num_bytes):.2f} GiB for {plan.max_running_requests:,} request slots; "
                           f"--max-running-requests {max(plan.max_running_requests // 4, 1)} would cut it about 4x "
                           f"and give the KV pool the difference.")
            else:
                out.append(f"{name} takes {gib(t.num_bytes):.2f} GiB ({t.num_bytes / plan.budget_bytes:.0%} of the "
                           f"budget).")
    if kv_cache_dtype in ("auto", "bfloat16", "float16", "bf16", "fp16") and plan.kv_cell_bytes > 0:
        out.append(f"--kv-cache-dtype fp8_e4m3 halves the KV cell to {plan.kv_cell_bytes // 2:,} B/token "
                   f"(about {2 * plan.max_total_num_tokens:,} tokens in the same pool).")
    return out


def _model_name(path: str) -> str:
    import os

    path = path.rstrip("/")
    if path.endswith(".json"):
        path = os.path.dirname(path) or path
    return os.path.basename(path)


def run(argv: Optional[list[str]] = None) -> tuple[int, dict, str]:
    """Returns (exit status, JSON-able result, text report)."""
    args = build_parser().parse_args(argv)
    shape = model_shape_from_path(args.model_path)
    gpu = get_gpu_preset(args.gpu)
    inputs, ctx = _inputs(args, shape, gpu)
    backend = ctx["attention_backend"]
    header = {
        "model": _model_name(args.model_path),
        "model_type": shape.text.model_type,
        "num_params": shape.num_params,
        "weight_dtype": shape.text.dtype,
        "gpu": gpu.name,
        "gpu_memory_total_mib": gpu.memory_total_mib,
        "pre_load_free_bytes": gpu.pre_load_free_bytes,
        "tp_size": args.tp,
        "context_len": ctx["context_len"],
        "attention_backend": backend,
        "kv_cache_dtype": args.kv_cache_dtype,
        "kv_cell_bytes": inputs.kv_cell_bytes,
    }
    upstream = upstream_comparison(inputs, backend, gpu)
    lines = [
        f"sglang plan: {header['model']} ({shape.text.model_type}, {shape.num_params / 1e9:.2f}B params, "
        f"{shape.text.dtype}) on {gpu.name} x tp={args.tp}",
        f"  context {ctx['context_len']:,} | attention {backend} | kv cache {args.kv_cache_dtype} "
        f"({inputs.kv_cell_bytes:,} B/token/rank) | page {inputs.page_size}",
        f"  budget: {gib(gpu.pre_load_free_bytes):.2f} GiB pre-load free per rank "
        f"(memory.total {gpu.memory_total_mib:,} MiB; typical free before load)",
        "",
    ]
    try:
        plan = plan_memory(inputs)
    except MemoryPlanError as e:
        result = {"fits": False, **header, "error": e.to_dict(), "upstream": upstream}
        lines += ["DOES NOT FIT.", str(e)]
        tp_fix = None if e.direction else _smallest_tp_that_fits(args, shape, gpu)
        if tp_fix is not None:
            result["fits_with_tp"] = tp_fix
            lines.append(f"What to change: --tp {tp_fix} fits (same GPU, per-rank weights and KV heads sharded).")
        return 1, result, "\n".join(lines)
    tips = hints(plan, inputs, args.kv_cache_dtype)
    result = {"fits": True, **header, "plan": plan.to_dict(), "upstream": upstream, "hints": tips}
    lines += [plan.render_table(), "", "FITS. " + plan.explain()]
    effect = encoder_effect(plan, inputs)
    if effect is not None:
        result["encoder_effect"] = effect
        lines.append(f"Encoder reservation + embedding cache: {gib(effect['reserved_bytes']):.3f} GiB, charged to the "
                     f"KV pool: {effect['kv_tokens_with']:,} tokens with them, {effect['kv_tokens_without']:,} "
                     f"without ({effect['kv_tokens_lost']:,} fewer).")
    lines.append("")
    lines.append(_upstream_line(upstream))
    if tips:
        lines.append("What to change:")
        lines += [f"  - {t}" for t in tips]
    return 0, result, "\n".join(lines)


def _smallest_tp_that_fits(args, shape, gpu, candidates=(2, 4, 8, 16)) -> Optional[int]:
    for tp in candidates:
        if tp <= args.tp:
            continue
        trial = argparse.Namespace(**{**vars(args), "tp": tp})
        try:
            plan_memory(_inputs(trial, shape, gpu)[0])
            return tp
        except MemoryPlanError:
            continue
    return None


def _upstream_line(u: dict) -> str:
    head = (f"Upstream SGLang (classic auto y={u['mem_fraction_static']:.5g}): ")
    if not u["starts"]:
        return head + "fails at startup (weights exceed the static region)."
    verdict = (f"{gib(u['slack_left_bytes']):.2f} GiB of its slack unused" if u["slack_left_bytes"] >= 0 else
               f"runtime OOM: its unplanned consumers exceed the slack by {gib(-u['slack_left_bytes']):.2f} GiB")
    return head + (f"{u['max_total_num_tokens']:,} tokens, {u['max_running_requests']:,} slots, "
                   f"{gib(u['slack_bytes']):.2f} GiB slack -> {verdict}.")


def main(argv: Optional[list[str]] = None) -> int:
    status, result, text = run(argv)
    if "--json" in (argv if argv is not None else sys.argv[1:]):
        print(json.dumps(result, indent=2, default=str))
    else:
        print(text)
    return status


if __name__ == "__main__":
    sys.exit(main())

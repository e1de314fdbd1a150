"""`sglang plan`: a memory-plan dry run -- no weights, and no GPU.

It takes the same flags as `sglang serve` (generated from ServerArgs) and builds the plan inputs with the same function
as the server (mem_plan/build.py). What replaces the hardware:
    --gpu PRESET                     a GPU's memory.total and typical pre-load free memory (mem_plan/gpu_presets.py);
                                     given several times, one plan per card (--json: a list of the cards' objects)
    --device cpu [--total-memory-gb N]  a CPU with N GiB available (default: this machine's available RAM)
    --measured TERM=BYTES            a measured term (weights, activations, cuda_graphs, encoder) instead of its formula
Weights, activations and CUDA graphs come from declared formulas (mem_plan/model_shapes.py) unless --measured gives
them; every other term is declared or formula exactly as the server computes it. Prints the plan, whether it fits,
what limits it and what to change; --json prints one JSON object. --plot FILE (.png / .svg) draws the budget as
stacked bars of the terms, one bar per card (cli/plan_plot.py; matplotlib, the `plot` extra). Exit status: 0 fits
(on every card), 1 does not fit (on some card), 2 bad flags.

    sglang plan --model-path meta-llama/Llama-3.1-8B --gpu h100-80gb [--tp 2] [--json]
    sglang plan --model-path Qwen/Qwen3-30B-A3B --gpu h100-80gb --gpu h20 --gpu h200 --plot cards.svg
    sglang plan --device cpu --max-total-memory-gb 2          # the default model, as `sglang serve` would start
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Optional

from sglang.cli.plan_plot import INSTALL_HINT, check_plot_path, require_matplotlib, write_plot
from sglang.cli.plan_upstream import upstream_comparison, upstream_line
from sglang.srt.configs.resolved import (
    check_tp_sharding,
    cpu_kernels_available,
    fused_cpu_decode,
    use_fp32_kernels,
    plan_backend,
    planned_weight_format,
    resolve_model,
)
from sglang.srt.mem_plan import MemoryPlan, MemoryPlanError, PlanInputs, plan_memory
from sglang.srt.mem_plan import build as B
from sglang.srt.mem_plan.arch_registry import not_served_note
from sglang.srt.mem_plan.encoder import EncoderTerm, encoder_term_name
from sglang.srt.mem_plan.encoder_plan import MODALITY_ORDER
from sglang.srt.mem_plan.gpu_presets import GPU_PRESETS, get_gpu_preset
from sglang.srt.mem_plan.model_shapes import load_config
from sglang.srt.mem_plan.units import GiB, gib
from sglang.srt.server_args import ServerArgs

# A hint is printed for a non-KV term above this share of the budget.
HINT_TERM_SHARE = 0.10
MEASURED_FIELDS = {"weights": "weight_bytes", "activations": "activation_bytes", "cuda_graphs": "cuda_graph_bytes",
                   "encoder": "encoder_bytes"}
MEASURED_ENCODERS = tuple(encoder_term_name(m) for m in MODALITY_ORDER)  # --measured encoder_video=BYTES


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sglang plan", description="Plan memory for `sglang serve` flags, without "
                                "weights or a GPU. Takes every `sglang serve` flag, plus the hardware group below.")
    ServerArgs.add_cli_args(p)
    p.add_argument("--tp", dest="tp_size", type=int, default=argparse.SUPPRESS, help="Alias of --tp-size; the plan is per rank.")
    hw = p.add_argument_group("hardware (what replaces the device in the dry run)")
    hw.add_argument("--gpu", action="append", default=None,
                    help=f"GPU preset: {', '.join(GPU_PRESETS)}. Several --gpu: one plan per card.")
    hw.add_argument("--total-memory-gb", type=float, default=None,
                    help="With --device cpu: the RAM available to the server, in GiB. Default: this machine's.")
    hw.add_argument("--measured", action="append", default=[], metavar="TERM=BYTES",
                    help=f"Use a measured value for a term instead of its formula "
                         f"({', '.join(MEASURED_FIELDS)}, {', '.join(MEASURED_ENCODERS)}).")
    p.add_argument("--json", action="store_true", help="Print one JSON object (a list of them for several --gpu).")
    p.add_argument("--plot", default=None, metavar="FILE",
                   help=f"Draw the budget as stacked bars of the terms, one bar per card, to FILE (.png or .svg). "
                        f"Needs matplotlib: {INSTALL_HINT}.")
    return p


def refuse(message: str) -> None:
    """Exit 2 with argparse's "sglang plan: error:" line but without the usage block: the flags were well formed, the
    model (or what it lacks) is the problem."""
    print(f"sglang plan: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def parse_args(argv) -> tuple[ServerArgs, argparse.Namespace]:
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        sa = ServerArgs.from_cli_args(ns)
    except ValueError as e:
        parser.error(str(e))
    if ns.gpu is None and sa.device != "cpu":
        parser.error("say which hardware to plan for: --gpu PRESET, or --device cpu [--total-memory-gb N].")
    if ns.gpu is not None and sa.device == "cpu":
        parser.error("--gpu and --device cpu exclude each other.")
    for key in ns.gpu or ():
        try:
            get_gpu_preset(key)
        except KeyError as e:
            parser.error(f"--gpu {key!r}: {e.args[0]}")
    if ns.plot is not None:
        try:
            problem = check_plot_path(ns.plot)
            if problem is None:
                require_matplotlib()
        except ImportError as e:
            problem = str(e)
        if problem:
            parser.error(problem)
    for item in ns.measured:
        term, _, value = item.partition("=")
        if term not in MEASURED_FIELDS and term not in MEASURED_ENCODERS or not value.isdigit():
            parser.error(f"--measured {item!r}: use TERM=BYTES with TERM one of "
                         f"{', '.join(MEASURED_FIELDS)}, {', '.join(MEASURED_ENCODERS)}.")
    return sa, ns


def device_facts(sa: ServerArgs, ns, model: B.ModelFacts) -> B.DeviceFacts:
    if ns.gpu is not None:
        gpu = get_gpu_preset(ns.gpu)
        return B.DeviceFacts("cuda", gpu.pre_load_free_bytes, gpu.memory_total_bytes)
    from sglang.srt.mem_plan.measure import cpu_available_bytes

    from sglang.srt.configs.resolved import scheduler_cpu_threads

    free = int(ns.total_memory_gb * GiB) if ns.total_memory_gb is not None else cpu_available_bytes()
    return B.DeviceFacts("cpu", free, free, fused_cpu_decode(model, "cpu"), cpu_kernels_available("cpu"),
                         scheduler_cpu_threads(sa))


def model_facts(sa: ServerArgs, device_kind: str) -> tuple[B.ModelFacts, str]:
    """The model as the server resolves it (configs/resolved.py), with the weight format the plan charges."""
    path, gguf_path = sa.model_path, None
    if path is None or path.endswith(".gguf"):  # the bundled default model / a GGUF: its converted config.json
        from sglang.srt.model_loader import resolve_model_path
        from sglang.srt.model_loader.model_path import gguf_source_path

        path, gguf_path = resolve_model_path(sa, dense_linears=False), gguf_source_path(sa)  # config only
    cfg = load_config(path)
    model = resolve_model(cfg, device_kind, sa.dtype, sa.kv_cache_dtype, sa.context_length, planning=True)
    use_fp32_kernels(sa.dtype, device_kind, model.dtype)  # as the runner decides it (the decode workspace follows)
    check_tp_sharding(model.shape, sa.tp_size, sa.ep_size)
    fmt = planned_weight_format(sa, cfg.get("quantization_config"), gguf_path, device_kind, model.dtype)
    return dataclasses.replace(model, weight_format=fmt), path


def plan_inputs(sa: ServerArgs, ns, model: B.ModelFacts, device: B.DeviceFacts) -> PlanInputs:
    measured = B.formula_terms(sa, model, device)
    overrides, encoders = {}, {t.name: t for t in measured.encoder_terms}
    for item in ns.measured:
        term, _, value = item.partition("=")
        if term in MEASURED_ENCODERS:
            if term not in encoders:
                refuse(f"--measured {term}: the model has no such encoder term ({', '.join(encoders) or 'none'}).")
            encoders[term] = dataclasses.replace(encoders[term], num_bytes=int(value), source="measured")
            continue
        overrides[MEASURED_FIELDS[term]] = int(value)
        measured.sources[term] = "measured"
    measured = dataclasses.replace(measured, encoder_terms=tuple(encoders.values()), **overrides)
    return B.build_plan_inputs(sa, model, device, measured)


def encoder_effect(plan: MemoryPlan, inputs: PlanInputs) -> Optional[dict]:
    """What the encoder reservation and the embedding cache cost the KV pool: the same plan without them."""
    reserved = inputs.encoder_total_bytes + inputs.mm_cache_bytes
    if reserved == 0:
        return None
    try:
        without = plan_memory(dataclasses.replace(inputs, encoder_bytes=0, encoder_terms=(), mm_cache_bytes=0))
    except MemoryPlanError:
        return None
    return {"reserved_bytes": reserved, "kv_tokens_with": plan.max_total_num_tokens,
            "kv_tokens_without": without.max_total_num_tokens,
            "kv_tokens_lost": without.max_total_num_tokens - plan.max_total_num_tokens}


def hints(plan: MemoryPlan, inputs: PlanInputs, kv_cache_dtype: str) -> list[str]:
    out = []
    if plan.max_total_num_tokens < plan.context_len:
        out.append(f"The KV pool holds {plan.max_total_num_tokens:,} tokens, less than one full-context request: "
                   f"use --context-length {plan.max_total_num_tokens // 2:,} or less, more --tp, or fp8 KV.")
    names = ("attention_workspace", "req_to_token", "logits", "activations", "moe_workspace", "encoder",
             *MEASURED_ENCODERS)
    for t in (t for t in plan.terms if t.name in names):
        name = t.name
        if t.num_bytes > HINT_TERM_SHARE * plan.budget_bytes:
            if name == "moe_workspace":
                out.append(f"moe_workspace takes {gib(t.num_bytes):.2f} GiB at --chunked-prefill-size "
                           f"{plan.chunked_prefill_size}; it shrinks in proportion to a smaller chunk.")
            elif name in ("attention_workspace", "req_to_token", "logits") and inputs.max_running_requests is None:
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
    path = path.rstrip("/")
    if path.endswith(".json"):
        path = os.path.dirname(path) or path
    return os.path.basename(path)


def run(argv: Optional[list[str]] = None) -> tuple[int, object, str]:
    """Returns (exit status, JSON-able result, text report): one card's result dict, or a list of them when --gpu is
    given several times (status 1 when any card does not fit). --plot writes the cards' bars."""
    sa, ns = parse_args(argv)
    cards = [argparse.Namespace(**{**vars(ns), "gpu": key}) for key in ns.gpu] if ns.gpu else [ns]
    runs = [_run_card(sa, card) for card in cards]
    results = [r for _, r, _ in runs]
    text = ("\n\n" + "=" * 100 + "\n\n").join(t for _, _, t in runs)
    if ns.plot is not None:
        write_plot(results, ns.plot)
        text += f"\n\nPlot: {ns.plot} ({len(results)} card{'s' if len(results) > 1 else ''})."
    status = max(s for s, _, _ in runs)
    return status, (results if len(results) > 1 else results[0]), text


def _run_card(sa: ServerArgs, ns) -> tuple[int, dict, str]:
    """One card's plan: ns.gpu is one preset key (or None for --device cpu)."""
    gpu = get_gpu_preset(ns.gpu) if ns.gpu is not None else None
    # refused as a start refuses them (the same functions, the same messages): the backend, the context length,
    # the weight format, a --tp-size the model cannot be split over
    try:
        requested, platform = sa.attention_backend, gpu.platform if gpu is not None else None
        choice = plan_backend(requested, platform)
        sa = dataclasses.replace(sa, attention_backend=choice.name)
        model, path = model_facts(sa, "cuda" if gpu is not None else "cpu")
        if model.shape.text.is_mla:  # as the runner re-resolves once the config is read
            choice = plan_backend(requested, platform, mla=True)
            sa = dataclasses.replace(sa, attention_backend=choice.name)
        from sglang.srt.mem_plan.kv_quant import check_kv_format_backend

        check_kv_format_backend(model.kv_cache_dtype, choice.name)  # as the runner refuses it
    except ValueError as e:
        refuse(str(e))
    device = device_facts(sa, ns, model)
    try:
        inputs = plan_inputs(sa, ns, model, device)
    except ValueError as e:  # e.g. a draft model the planner cannot size (--speculative-*), named as a start names it
        refuse(str(e))
    backend = choice.name
    shape = model.shape
    header = {
        "model": _model_name(path), "model_type": shape.text.model_type, "num_params": shape.num_params,
        "weight_dtype": model.dtype, "gpu": gpu.name if gpu else "cpu",
        "gpu_memory_total_mib": gpu.memory_total_mib if gpu else None,
        "pre_load_free_bytes": device.pre_load_free_bytes, "tp_size": sa.tp_size, "dp_size": sa.dp_size,
        "context_len": model.context_len,
        "attention_backend": backend, "attention_backend_reason": choice.reason, "kv_cache_dtype": sa.kv_cache_dtype, "kv_cell_bytes": inputs.kv_cell_bytes,
    }
    if gpu is None:  # this machine: the ISA level that chose the dtype and the weight format, as a start resolves it
        from sglang.jit_kernel.cpu_isa import cpu_isa_summary

        header["cpu_isa"] = cpu_isa_summary()
    where = (f"{gpu.name} x tp={sa.tp_size}" if gpu else
             f"CPU level {header['cpu_isa']} ({gib(device.pre_load_free_bytes):.2f} GiB available)")
    if sa.dp_size > 1:  # the plan below is one replica's (memory flags are per replica; CPU RAM is shared: / dp)
        where += f" x dp={sa.dp_size} replicas, each planned as below"
    lines = [
        f"sglang plan: {header['model']} ({shape.text.model_type}, {shape.num_params / 1e9:.2f}B params, "
        f"{model.dtype}) on {where}",
        f"  context {model.context_len:,} | attention {backend} ({choice.reason}) | kv cache {sa.kv_cache_dtype} "
        f"({inputs.kv_cell_bytes:,} B/token/rank) | page {inputs.page_size}",
        f"  budget: {gib(inputs.pre_load_free_bytes):.2f} GiB pre-load free per rank"
        + (f" (memory.total {gpu.memory_total_mib:,} MiB; typical free before load)" if gpu else ""),
        "",
    ]
    upstream = upstream_comparison(inputs, backend, gpu, shape.text.vocab_size) if gpu else None
    served_note = not_served_note(shape.text.model_type, shape.text.layer_kinds)  # planned, not served (the words a start refuses with)
    if not served_note and gpu is not None and model.weight_format.method == "fp8":
        from sglang.srt.layers.quantization.fp8_block_config import fp8_path_refusal

        served_note = fp8_path_refusal(load_config(path))  # priced as the checkpoint's blocks; a start refuses it
    try:
        plan = plan_memory(inputs)
        if served_note:
            plan = dataclasses.replace(plan, notes=plan.notes + (served_note,))
    except MemoryPlanError as e:
        result = {"fits": False, **header, "error": e.to_dict(), "upstream": upstream}
        lines += ["DOES NOT FIT.", str(e)]
        if served_note:
            result["notes"] = [served_note]
            lines.append(served_note)
        tp_fix = None if e.direction else _smallest_tp_that_fits(sa, ns, model)
        if tp_fix is not None:
            result["fits_with_tp"] = tp_fix
            lines.append(f"What to change: --tp {tp_fix} fits (same GPU, per-rank weights and KV heads sharded).")
        return 1, result, "\n".join(lines)
    tips = hints(plan, inputs, sa.kv_cache_dtype)
    result = {"fits": True, **header, "plan": plan.to_dict(), "upstream": upstream, "hints": tips}
    lines += [plan.render_table(), "", "FITS. " + plan.explain()]
    effect = encoder_effect(plan, inputs)
    if effect is not None:
        result["encoder_effect"] = effect
        lines.append(f"Encoder reservation + embedding cache: {gib(effect['reserved_bytes']):.3f} GiB, charged to the "
                     f"KV pool: {effect['kv_tokens_with']:,} tokens with them, {effect['kv_tokens_without']:,} "
                     f"without ({effect['kv_tokens_lost']:,} fewer).")
    if upstream is not None:
        lines += ["", upstream_line(upstream)]
    if tips:
        lines.append("What to change:")
        lines += [f"  - {t}" for t in tips]
    return 0, result, "\n".join(lines)


def _smallest_tp_that_fits(sa, ns, model, candidates=(2, 4, 8, 16)) -> Optional[int]:
    for tp in candidates:
        if tp <= sa.tp_size:
            continue
        try:
            trial = dataclasses.replace(sa, tp_size=tp)  # per-rank plan (ValueError: nnodes does not divide tp)
            check_tp_sharding(model.shape, tp, trial.ep_size)
            plan_memory(plan_inputs(trial, ns, model, device_facts(trial, ns, model)))
            return tp
        except (MemoryPlanError, ValueError):
            continue
    return None


def main(argv: Optional[list[str]] = None) -> int:
    status, result, text = run(argv)
    if "--json" in (argv if argv is not None else sys.argv[1:]):
        print(json.dumps(result, indent=2, default=str))
    else:
        print(text)
    return status


if __name__ == "__main__":
    sys.exit(main())

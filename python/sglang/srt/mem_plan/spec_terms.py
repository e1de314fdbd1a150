"""Speculative decoding's terms of the memory plan (issue 44): built from the --speculative-* flags and the draft's
config.json by build_spec_inputs (called by mem_plan/build.build_plan_inputs, so a start and `sglang plan` price the
same bytes), and rendered as MemoryTerms by spec_terms.

Plan-side API (what the runtime allocates from; names fixed):
    MemoryPlan.speculative: spec_sizes.SpecPlan | None      (None without --speculative-algorithm)
        .draft_kv_cell_bytes   the draft's KV bytes per token slot on this rank (0: NGRAM, no draft)
        .draft_kv_fixed_bytes  its fixed scales (fp8), 0 otherwise
        .draft_kv_rows         = max_total_num_tokens + page_size: the draft pool has the target pool's rows, the
                                 same token slot indices (slot i of both pools is the same token)
        .draft_kv_bytes        = draft_kv_rows x draft_kv_cell_bytes + draft_kv_fixed_bytes (term draft_kv_cache)
        .draft_weight_bytes    the draft model's / head's weights (term draft_weights), at .draft_dtype
        .draft_num_layers      its KV layers (an EAGLE head: 1)
        .verify_rows_per_req   a request's rows in one verify forward (spec_sizes.verify_rows_per_request): a
                               chain's num_draft_tokens, a tree's branches expanded, B x (depth + 1), not
                               upstream's num_draft_tokens = nodes + 1 (the flag keeps that meaning)
        .verify_tokens         the most tokens one verify forward may hold (spec_sizes.verify_token_cap of
                               verify_rows_per_req a slot)
        .verify_row_bytes, .hidden_row_bytes, .draft_cuda_graph_bytes
        .branch_rows           a tree's side-branch rows of the request table beyond the request slots
                               (spec_sizes.branch_rows; 0 for a chain)
Terms (MemoryPlan.terms, in to_dict(), `sglang plan` and /server_info's memory_plan):
    draft_weights        STANDALONE: the draft checkpoint sized from its config.json like any model (arch_*.py);
                         EAGLE / EAGLE3: the head's own tensors (draft_heads.py); NEXTN: the MTP layers.
                         Always unsharded (tp=1): with --tp-size > 1 the draft runs on rank 0 alone
                         (model_executor/draft_runner.py), and a head there also holds whole copies of the target
                         tables it reads (draft_head.full_tables: the embedding; EAGLE / NEXTN the lm_head too unless
                         tied). Every rank plans the same terms, so the other ranks keep these bytes (and the draft
                         KV's) unused: their KV pool has rank 0's token count
    draft_kv_cache       the draft's pool over the target's token slots: the solver's cost of a token is
                         target cell + draft cell, so max_total_num_tokens falls accordingly
    req_to_token, attention_workspace, kv_window (the target's terms) a tree's branch rows beside the slots: table
                         rows, the backend's per-sequence index buffers, the window map's entries
    logits               (the target's term) the sampler's rows for verify_token_cap rows instead of one per slot
                         (verify_rows_per_req a slot: a tree's expanded rows)
    spec_hidden_states   EAGLE heads / MTP layers: the target's hidden states per verify row (EAGLE3: 3 layers')
    draft_attention_workspace  the persistent buffers of the draft's own attention backend (the target's backend
                         kind, the draft's heads, the target's context), one set per request-table row: the slots and
                         a tree's branch rows, which a head's beam decodes in one batch (0 for torch_native)
    draft_cuda_graphs    0 for every served draft (STANDALONE / EAGLE / EAGLE3 / NEXTN): the DraftRunner
                         (model_executor/draft_runner.py) decodes the draft or head eagerly and captures no graphs, and
                         a plan prices only what a start allocates. Verify forwards run eagerly (EXTEND), so no verify
                         graphs for any algorithm
The verify forward's activations need no term: it holds at most verify_token_cap <= chunked_prefill_size tokens,
which the activation term's profile forward covers (MemoryPlan.explain says so).
"""

from __future__ import annotations

import os
from typing import Callable, Optional

from sglang.srt.mem_plan import draft_heads as H
from sglang.srt.mem_plan.dtypes import dtype_bytes
from sglang.srt.mem_plan.kv_quant import is_quantized
from sglang.srt.mem_plan.model_shapes import load_config, model_shape_from_config
from sglang.srt.mem_plan.plan import MemoryTerm
from sglang.srt.mem_plan.sizes import sampler_bytes_per_slot
from sglang.srt.mem_plan.spec_sizes import (SpecInputs, draft_kv_pool_bytes, largest_tree, verify_budget_tokens,
                                            verify_rows_per_request)
from sglang.srt.mem_plan.dtypes import resolve_kv_cache_dtype
from sglang.srt.mem_plan.specs import KVCellSpec, kv_dtype_bytes

FLAG = "--speculative-draft-model-path"
NO_GRAPHS_CPU = "no CUDA graphs on a CPU: the draft decodes eagerly"
NO_GRAPHS_OFF = "no decode graphs with these flags (cuda_graph_max_bs 0): the draft decodes eagerly"
NO_GRAPHS_STANDALONE = "STANDALONE: the draft decodes eagerly (model_executor/draft_runner.py captures no graphs)"
NO_GRAPHS_HEAD = ("{algorithm}: the head decodes eagerly (model_executor/draft_runner.py captures no graphs; "
                  "speculative/eagle_proposer.py runs it after every target forward)")
# drafts the served DraftRunner runs eagerly: a plan prices no graphs for them (a start captures none)
EAGER_DRAFTS = ("STANDALONE", "EAGLE", "EAGLE3", "NEXTN")


def draft_config(path: str) -> dict:
    """The draft's config.json (a checkpoint directory or a .json file); ValueError naming the flag."""
    if not path or not os.path.exists(path):
        raise ValueError(f"{FLAG} {path!r}: no such directory or config.json; the plan sizes the draft from its "
                         f"config.json, so pass a local checkpoint directory.")
    try:
        return load_config(path)
    except (OSError, ValueError) as e:
        raise ValueError(f"{FLAG} {path!r}: cannot read its config.json ({e}).") from e


def _standalone(cfg: dict, tp: int, ep: int, dtype: str, kv_cache_dtype: str) -> dict:
    try:
        shape = model_shape_from_config(cfg)
    except ValueError as e:
        raise ValueError(f"{FLAG}: the STANDALONE draft model cannot be planned: {e}") from e
    text = shape.text
    other = sorted(set(text.layer_kinds) - {"full"})
    if shape.encoders or other or text.is_mla:
        what = "an encoder" if shape.encoders else "MLA attention" if text.is_mla else f"{'/'.join(other)} layers"
        raise ValueError(f"{FLAG}: the STANDALONE draft ({text.model_type}) has {what}; a draft's KV pool shares the "
                         f"target's token slots, which the planner prices for a draft of full-attention layers only.")
    if cfg.get("quantization_config"):
        raise ValueError(f"{FLAG}: the STANDALONE draft is quantized ({cfg['quantization_config'].get('quant_method')})"
                         f"; the planner prices draft models in the served dtype only.")
    cell = shape.kv_cell(kv_cache_dtype, tp, dtype)
    return dict(weights=shape.dense_weight_bytes(tp, dtype_bytes(dtype), ep), cell=cell, vocab=text.vocab_size,
                draft=f"{text.model_type}, {text.num_layers} layers, {shape.num_params / 1e6:.1f}M params",
                weights_detail=f"{shape.num_params:,} params x {dtype} + rope tables (config.json)")


def _eagle(algorithm: str, cfg: dict, target, tp: int, dtype: str, kv_cache_dtype: str) -> dict:
    elem = dtype_bytes(dtype)
    if algorithm == "EAGLE3":
        groups = H.eagle3_head_weights(cfg, target.hidden_size, tp)
        maps = H.eagle3_map_bytes(cfg)
        vocab = H.eagle3_vocab(cfg)[0]
    else:
        groups, maps, vocab = H.eagle_head_weights(cfg, tp), 0, target.vocab_size
    head = model_shape_from_config(cfg)  # a Llama-layout config: its KV geometry (one layer for a head)
    params = sum(g.numel for g in groups)
    # the head's rotary table spans the target's positions too (DraftRunner._load_head widens a shorter one)
    rows = max(head.text.max_position_embeddings, target.max_position_embeddings)
    rope = head.text.rope_tables * rows * head.text.rotary_dim * elem
    return dict(weights=H.groups_bytes(groups, elem) + maps + rope, cell=head.kv_cell(kv_cache_dtype, tp, dtype),
                vocab=vocab, draft=f"{algorithm} head, {head.text.num_layers} layer, {params / 1e6:.1f}M params",
                weights_detail=f"{params:,} params x {dtype} + rope table {rope:,} B"
                + (f" + d2t/t2d maps {maps:,} B" if maps else "")
                + "; embedding" + ("" if algorithm == "EAGLE3" else " and lm_head") + " shared with the target")


def _nextn(cfg: dict, tp: int, ep: int, dtype: str, kv_cache_dtype: str, weight_format) -> dict:
    """The MTP layers are stored as the target's layers are: a checkpoint format (fp8 blocks) prices them as it
    prices those (checkpoint_formats.py); otherwise the served dtype."""
    n = H.nextn_layers(cfg)
    groups = H.nextn_weights(cfg, tp, ep)
    fmt_ckpt = getattr(weight_format, "checkpoint", None)
    elem = dtype_bytes(dtype)
    weights = (sum(fmt_ckpt.group_bytes(g, elem) for g in groups) if fmt_ckpt is not None
               else H.groups_bytes(groups, elem))
    held = f"{weight_format.method} as the target's layers" if fmt_ckpt is not None else dtype
    fmt = resolve_kv_cache_dtype(kv_cache_dtype, dtype)
    cell = KVCellSpec(n, kv_dtype_bytes(kv_cache_dtype, dtype), kv_lora_rank=H.C.need(cfg, "kv_lora_rank"),
                      qk_rope_head_dim=H.C.need(cfg, "qk_rope_head_dim"), tp_size=tp,
                      kv_format=fmt if is_quantized(fmt) else "")
    params = sum(g.numel for g in groups)
    # the head's decoder layer holds its own rotary table, as the target's layers do (models/deepseek_nextn.py)
    text = model_shape_from_config(cfg).text
    rope = text.rope_tables * text.max_position_embeddings * text.rotary_dim * elem
    return dict(weights=weights + rope, cell=cell, vocab=H.C.need(cfg, "vocab_size"),
                draft=f"{n} MTP layer{'s' if n > 1 else ''} of {cfg['model_type']}, {params / 1e6:.1f}M params",
                weights_detail=f"{params:,} params in {held} + rope table {rope:,} B: eh_proj, enorm/hnorm, one "
                               "decoder layer each; embedding and shared head's lm_head are the target's")


def _on_rank0(d: dict, algorithm: str, target, tp: int, dtype: str) -> dict:
    """With --tp-size > 1: a head's whole copies of the target tables it reads join its weights; the detail says
    where the draft is and that the other ranks keep its bytes unused."""
    tables = 0
    if algorithm != "STANDALONE":
        count = 1 if algorithm == "EAGLE3" or target.tie_word_embeddings else 2
        tables = count * target.vocab_size * target.hidden_size * dtype_bytes(dtype)
        d = dict(d, weights=d["weights"] + tables)
    what = f"; at --tp-size {tp} the head reads whole copies of those tables, {tables:,} B" if tables else ""
    return dict(d, weights_detail=d["weights_detail"] + what + f"; unsharded, on TP rank 0 alone: the other "
                f"{tp - 1} rank(s) plan these bytes and leave them unused")


def build_spec_inputs(sa, shape, dtype: str, kv_cache_dtype: str, device_kind: str, graph_bs: int,
                      graph_bytes: Callable[[int, int], int], weight_format=None,
                      draft_workspace: Optional[Callable] = None) -> Optional[SpecInputs]:
    """SpecInputs for `sa` (a ServerArgs) serving `shape` (model_shapes.ModelShape) in `dtype` (weight_format: the
    target's, quantization_sizes.WeightFormat); None without --speculative-algorithm. graph_bytes(graph_bs, vocab):
    the dry run's CUDA-graph formula (build.py); draft_workspace(draft ModelShape): the WorkspaceSpec of the
    persistent buffers the draft's attention backend allocates per request-table row (build.py; None: not priced)."""
    resolve = getattr(sa, "speculative", None)
    spec = resolve() if callable(resolve) else None
    if spec is None:
        return None
    target, tp = shape.text, sa.tp_size
    dtp = dep = 1  # the draft's own view: unsharded, on rank 0 alone (module docstring)
    common = dict(algorithm=spec.algorithm, num_draft_tokens=spec.num_draft_tokens,
                  verify_rows_per_req=verify_rows_per_request(spec.topk, spec.num_steps, spec.num_draft_tokens),
                  verify_row_bytes=sampler_bytes_per_slot(target.vocab_size),
                  verify_budget_tokens=verify_budget_tokens(device_kind))
    common["tree_branches"], common["tree_depth"] = largest_tree(spec.topk, spec.num_steps, spec.num_draft_tokens)
    if spec.algorithm == "NGRAM":
        return SpecInputs(**common, draft="none (NGRAM proposes from the text)",
                          graphs_detail="NGRAM: no draft model; verify forwards run eagerly (EXTEND)")
    if spec.algorithm == "STANDALONE":
        d = _standalone(draft_config(spec.draft_model_path), dtp, dep, dtype, kv_cache_dtype)
    elif spec.algorithm in ("EAGLE", "EAGLE3"):
        d = _eagle(spec.algorithm, draft_config(spec.draft_model_path), target, dtp, dtype, kv_cache_dtype)
    elif spec.algorithm == "NEXTN":
        d = _nextn(draft_config(spec.draft_model_path) if spec.draft_model_path else shape.text_config, dtp, dep,
                   dtype, kv_cache_dtype, weight_format)
    else:
        raise ValueError(f"--speculative-algorithm {spec.algorithm}: the planner has no terms for it")
    if tp > 1:
        d = _on_rank0(d, spec.algorithm, target, tp, dtype)
    if draft_workspace is not None:  # the shape the DraftRunner's backend is built from (its config.json)
        ws = draft_workspace(model_shape_from_config(draft_config(spec.draft_model_path))
                             if spec.draft_model_path else shape)
        common.update(draft_workspace_fixed_bytes=ws.fixed_bytes, draft_workspace_per_row_bytes=ws.per_req_bytes,
                      draft_workspace_detail=ws.name)
    hidden_states = {"EAGLE3": 3, "EAGLE": 1, "NEXTN": 1}.get(spec.algorithm, 0)  # target layers a draft reads
    cell = d["cell"]
    # a draft the served runner decodes eagerly gets no graphs (a plan prices what the runtime allocates); a draft
    # outside EAGER_DRAFTS would be priced with the head graphs upstream captures
    eager = spec.algorithm in EAGER_DRAFTS
    graphs = graph_bytes(graph_bs, d["vocab"]) if graph_bs > 0 and not eager else 0
    eager_reason = NO_GRAPHS_STANDALONE if spec.algorithm == "STANDALONE" else \
        NO_GRAPHS_HEAD.format(algorithm=spec.algorithm)
    reason = (NO_GRAPHS_CPU if device_kind == "cpu" else eager_reason if eager else NO_GRAPHS_OFF) \
        if not graphs else (f"draft decode graphs up to bs {graph_bs} (vocab {d['vocab']:,}), formula as the "
                            f"target's: what upstream holds for {spec.algorithm} (planned here, not served yet)")
    return SpecInputs(**common, hidden_row_bytes=hidden_states * target.hidden_size * dtype_bytes(dtype),
                      draft_weight_bytes=d["weights"], draft_kv_cell_bytes=cell.cell_bytes,
                      draft_kv_fixed_bytes=cell.fixed_bytes, draft_cuda_graph_bytes=graphs, draft=d["draft"],
                      draft_dtype=dtype, draft_num_layers=cell.num_layers, weights_detail=d["weights_detail"],
                      graphs_detail=reason + "; verify forwards run eagerly (EXTEND): no verify graphs")


def spec_terms(x, num_tokens: int, num_reqs: int) -> tuple[MemoryTerm, ...]:
    """The speculative terms of a plan at T tokens and R slots (x: PlanInputs); () without speculative decoding."""
    s = x.speculative
    if s is None:
        return ()
    src = x.source_of
    rows = s.verify_tokens(num_reqs, x.chunked_prefill_size)
    kv = draft_kv_pool_bytes(num_tokens, x.page_size, s.draft_kv_cell_bytes, s.draft_kv_fixed_bytes)
    return (
        MemoryTerm("draft_weights", s.draft_weight_bytes, src("draft_weights"),
                   f"{s.draft}; {s.weights_detail}" if s.draft_weight_bytes else f"{s.algorithm}: "
                   f"{s.draft}"),
        MemoryTerm("draft_kv_cache", kv, src("draft_kv_cache"),
                   f"({num_tokens:,} tokens + {x.page_size} dummy) x {s.draft_kv_cell_bytes:,} B"
                   + (f" + {s.draft_kv_fixed_bytes:,} B of scales" if s.draft_kv_fixed_bytes else "")
                   + f": {s.draft_num_layers} draft layer(s) over the target pool's token slots"
                   + (f", unsharded on TP rank 0 alone (the other {x.tp_size - 1} rank(s) leave it unused)"
                      if x.tp_size > 1 else "")
                   if s.draft_kv_cell_bytes else "no draft model: no draft KV"),
        MemoryTerm("spec_hidden_states", s.hidden_row_bytes * rows, src("spec_hidden_states"),
                   f"{s.hidden_row_bytes:,} B x {rows:,} verify rows: the target's hidden states the draft reads"
                   if s.hidden_row_bytes else "the draft reads no hidden states"),
        MemoryTerm("draft_cuda_graphs", s.draft_cuda_graph_bytes, src("draft_cuda_graphs"), s.graphs_detail),
        MemoryTerm("draft_attention_workspace", s.draft_workspace_bytes(num_reqs, x.chunked_prefill_size),
                   src("draft_attention_workspace"),
                   f"the draft's {s.draft_workspace_detail} backend: {s.draft_workspace_fixed_bytes:,} + "
                   f"{s.draft_workspace_per_row_bytes:,} x {num_reqs + s.branch_rows(num_reqs, x.chunked_prefill_size):,}"
                   f" request-table rows (slots + branch rows)" if s.draft_workspace_detail else
                   "no draft model: no draft backend"),
    )

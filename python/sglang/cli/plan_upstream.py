"""What upstream SGLang's classic auto mem_fraction_static would do on the same inputs, for `sglang plan`'s comparison
line and the zoo table (benchmark/plan_zoo.py).

y from the tier reserve (AITER-derated), KV = y * pre - weights, and everything else left to the unplanned
(1 - y) * pre slack. Upstream's own table and sampler sizes (int32 req_to_token, 8 B per vocabulary entry) are what
its slack must hold, with its fused MoE intermediate caches (the same shapes as moe_workspace).

Layers that do not keep every token are split off the static region by upstream's ratio knobs at their defaults
(/work/shared/notes/upstream-memory-facts.md, "Hybrid pools"; our planner solves these pools instead, layer_pools.py):
  sliding / chunked layers  --swa-full-tokens-ratio r = 0.8: a full token costs F + r x S (F, S: the full and
                            windowed layers' K/V bytes per token), full tokens = KV // that, windowed = r x full;
                            with no full layer, every token costs S.
  linear (Mamba / GDN)      --mamba-full-memory-ratio r = 0.9: state slots K = (KV x r / (1 + r)) // per-slot state,
                            the full layers get KV - (K + 1) x per-slot state, request slots <= K // 3.
Speculative decoding (classic): y's reserve grows by tiers.RESERVE_SPEC_MIB (EAGLE / EAGLE3 / NEXTN 2 GiB, STANDALONE
6 GiB, NGRAM nothing); the draft worker's pool reuses the target's T and the draft's weights load after the target's
KV pool, so its weights, its KV (T x the draft cell), the verify forward's extra logits rows (slots x num_draft_tokens
at upstream's 8 B per vocabulary entry) and the draft's hidden-state rows are all consumers of the unplanned slack.
"""

from __future__ import annotations

from sglang.srt.mem_plan import PlanInputs
from sglang.srt.mem_plan.sizes import (
    UPSTREAM_REQ_TO_TOKEN_ELEM_BYTES,
    UPSTREAM_SAMPLER_BYTES_PER_VOCAB_ENTRY,
    req_to_token_bytes,
)
from sglang.srt.mem_plan.slots import SlotRule
from sglang.srt.mem_plan.tiers import upstream_mem_fraction
from sglang.srt.mem_plan.units import gib

UPSTREAM_SWA_FULL_TOKENS_RATIO = 0.8  # --swa-full-tokens-ratio default
UPSTREAM_MAMBA_FULL_MEMORY_RATIO = 0.9  # --mamba-full-memory-ratio default
UPSTREAM_MAMBA_SLOTS_PER_REQUEST = 3  # max_num_reqs <= max_mamba_cache_size // 3 (no speculative / overlap mode)


def _page(tokens: int, page: int) -> int:
    return max(tokens, 0) // page * page


def upstream_pools(inputs: PlanInputs, kv_room_bytes: int) -> dict:
    """Upstream's split of the static region's KV bytes: full tokens, windowed (SWA) tokens, state slots."""
    pools, page = inputs.layer_pools, inputs.page_size
    full_cell, out = inputs.kv_cell_bytes, {"swa_tokens": 0, "mamba_cache_slots": 0, "slot_cap": None}
    room = max(kv_room_bytes, 0)
    if pools.linear_layers:
        r = UPSTREAM_MAMBA_FULL_MEMORY_RATIO
        per_slot = pools.state_bytes_per_slot
        k = int(room * r / (1 + r)) // per_slot
        out["mamba_cache_slots"] = k
        out["slot_cap"] = k // UPSTREAM_MAMBA_SLOTS_PER_REQUEST
        room = max(room - (k + 1) * per_slot, 0)
    if pools.windowed_layers:
        r = UPSTREAM_SWA_FULL_TOKENS_RATIO
        if full_cell:
            full = _page(int(room // (full_cell + r * pools.windowed_cell_bytes)), page)
            out.update(max_total_num_tokens=full, swa_tokens=_page(int(full * r), page))
        else:
            swa = _page(room // pools.windowed_cell_bytes, page)
            out.update(max_total_num_tokens=swa, swa_tokens=swa)
        return out
    out["max_total_num_tokens"] = _page(room // full_cell, page) if full_cell else 0
    return out


UPSTREAM_SPEC_RESERVE = {"NGRAM": None, "STANDALONE": "standalone", "EAGLE": "eagle", "EAGLE3": "eagle",
                         "NEXTN": "eagle"}  # --speculative-algorithm -> tiers.RESERVE_SPEC_MIB's key


def upstream_spec_bytes(inputs: PlanInputs, tokens: int, slots: int, logits_per_req: int) -> int:
    """What upstream's speculative decoding takes from the slack (module docstring); 0 without it."""
    s = inputs.speculative
    if s is None:
        return 0
    verify_rows = slots * s.num_draft_tokens
    return (s.draft_weight_bytes + (tokens + inputs.page_size) * s.draft_kv_cell_bytes + s.draft_kv_fixed_bytes
            + (verify_rows - slots) * logits_per_req + verify_rows * s.hidden_row_bytes + s.draft_cuda_graph_bytes)


def upstream_comparison(inputs: PlanInputs, backend: str, gpu, vocab_size: int) -> dict:
    """Upstream's classic auto plan on `inputs` (module docstring); slack_left_bytes < 0 is a runtime OOM."""
    upstream_logits_per_req = vocab_size * UPSTREAM_SAMPLER_BYTES_PER_VOCAB_ENTRY
    spec = inputs.speculative
    y = inputs.mem_fraction_static or upstream_mem_fraction(
        gpu.memory_total_mib, backend, inputs.context_len, tp_size=inputs.tp_size,
        chunked_prefill_size=inputs.chunked_prefill_size,
        speculative=UPSTREAM_SPEC_RESERVE[spec.algorithm] if spec is not None else None)
    pre = inputs.pre_load_free_bytes
    kv_room = int(y * pre) - inputs.weight_bytes
    pools = upstream_pools(inputs, kv_room)
    tokens = pools["max_total_num_tokens"]
    slots = SlotRule(inputs.context_len, inputs.max_running_requests).slots(tokens)
    if pools["slot_cap"] is not None:
        slots = min(slots, pools["slot_cap"])
    graph_bs = min(inputs.cuda_graph_max_bs or 0, slots)
    runtime = (inputs.workspace.bytes_for(slots, graph_bs)
               + req_to_token_bytes(slots, inputs.context_len, UPSTREAM_REQ_TO_TOKEN_ELEM_BYTES)
               + inputs.activation_bytes + upstream_logits_per_req * slots + inputs.cuda_graph_bytes
               + inputs.encoder_total_bytes + inputs.moe_workspace_bytes
               + upstream_spec_bytes(inputs, tokens, slots, upstream_logits_per_req))
    slack = pre - int(y * pre)
    return {"mem_fraction_static": y, "max_total_num_tokens": tokens, "max_running_requests": slots,
            "swa_tokens": pools["swa_tokens"], "mamba_cache_slots": pools["mamba_cache_slots"],
            "slack_bytes": slack, "unplanned_runtime_bytes": runtime, "slack_left_bytes": slack - runtime,
            "starts": kv_room > 0 and slots > 0}


def upstream_line(u: dict) -> str:
    head = (f"Upstream SGLang (classic auto y={u['mem_fraction_static']:.5g}): ")
    if not u["starts"]:
        return head + "fails at startup (weights exceed the static region)."
    verdict = (f"{gib(u['slack_left_bytes']):.2f} GiB of its slack unused" if u["slack_left_bytes"] >= 0 else
               f"runtime OOM: its unplanned consumers exceed the slack by {gib(-u['slack_left_bytes']):.2f} GiB")
    pools = ((f" + {u['swa_tokens']:,} SWA tokens (ratio {UPSTREAM_SWA_FULL_TOKENS_RATIO})" if u["swa_tokens"] else "")
             + (f" + {u['mamba_cache_slots']:,} mamba state slots (ratio {UPSTREAM_MAMBA_FULL_MEMORY_RATIO})"
                if u["mamba_cache_slots"] else ""))
    return head + (f"{u['max_total_num_tokens']:,} tokens{pools}, {u['max_running_requests']:,} slots, "
                   f"{gib(u['slack_bytes']):.2f} GiB slack -> {verdict}.")

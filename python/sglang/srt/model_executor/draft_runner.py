"""DraftRunner: the STANDALONE draft model or the EAGLE / EAGLE3 draft head of speculative decoding, beside the
target's ModelRunner.

Built after the target's pools exist (ModelRunner.init_draft_runner), so that:
  * it shares the target's req_to_token_pool: a request's row maps each of its positions to ONE slot index, used by
    both models; the draft's KV pool has the same number of slots (max_total_num_tokens, plus the dummy page) so
    every slot the target's allocator hands out is valid in it too, and whatever frees a slot (truncate after a
    rejection, retraction, radix eviction) frees it for both models at once;
  * its own KV pool holds the draft's layers, KV heads and head size in the draft's dtype (its own cell), never a
    quantized format (the target's ring rows are attached to the shared request table);
  * its own attention backend instance reads that pool.
The draft's weights and KV are terms of the memory plan (mem_plan/spec_sizes.py); check_allocation holds the pool to
the plan's draft KV term when the plan has one.

With --tp-size > 1 only rank 0 schedules and proposes (distributed/batch_sync.py), so the draft lives on rank 0 alone,
unsharded: build_draft_runner gives rank 0 a DraftRunner built, and run, inside parallel_state.single_rank_view (tp=1
layers, whole checkpoint tensors, collectives the identity; a thread-local view, so an overlap worker's target forward
keeps the real group), and the other ranks none (they only join the gather of a head's tables, draft_head.full_tables).
The plan prices the draft at tp=1 on every rank (mem_plan/spec_terms.py); the followers leave those bytes unused.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import List, Optional, Sequence, Tuple

import torch

from sglang.srt.distributed.parallel_state import single_rank_view
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode, move_to_device

logger = logging.getLogger(__name__)

# the plan's term for the draft model's KV pool (mem_plan: helper P's spec_terms)
DRAFT_KV_TERM = "draft_kv_cache"
DRAFT_WEIGHTS_TERM = "draft_weights"
DRAFT_WORKSPACE_TERM = "draft_attention_workspace"


def check_same_vocabulary(target_config, draft_config, draft_path: str) -> None:
    """A draft proposes token ids the target verifies: both must index the same vocabulary."""
    tv, dv = target_config.vocab_size, draft_config.vocab_size
    if tv != dv:
        raise ValueError(f"--speculative-draft-model-path {draft_path}: the draft model's vocabulary has {dv} "
                         f"tokens, the target's {tv}; a STANDALONE draft must share the target's tokenizer and "
                         "vocabulary (pick a draft from the same model family).")


def build_draft_runner(target, draft_path: str, algorithm: str) -> Optional["DraftRunner"]:
    """The DraftRunner of `target` (a ModelRunner) on TP rank 0; None on the other ranks (module docstring). Every
    rank calls it: with tp > 1 a head's tables are gathered first, before anything rank 0 alone may refuse."""
    from sglang.srt.model_executor.draft_head import full_tables

    tables = None
    if target.tp_size > 1 and algorithm != "STANDALONE":
        tables = full_tables(target.model, algorithm, target.tp_rank == 0)
    if target.tp_rank != 0:
        return None
    with single_rank_view():
        return DraftRunner(target, draft_path, algorithm, tables)


class DraftRunner:
    """The draft model (STANDALONE) or draft head (EAGLE, EAGLE3: model_executor/draft_head.py), its KV pool and
    attention backend; forward() runs one ForwardBatch of a draft model, forward_head() one of a head. Built on one
    rank (build_draft_runner); tables: a head's unsharded target tables at tp > 1 (draft_head.full_tables)."""

    def __init__(self, target, draft_path: str, algorithm: str = "STANDALONE", tables: Optional[tuple] = None):
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.model_executor.draft_head import check_unsharded
        from sglang.srt.model_loader import load_model

        self.algorithm = algorithm
        flag = f"--speculative-algorithm {algorithm}"
        if target.model_config.kv_cache_dtype_name != target.model_config.dtype_name:
            raise ValueError(f"{flag} with --kv-cache-dtype {target.model_config.kv_cache_dtype_name}: the draft's "
                             f"KV pool is held in the model's dtype only; drop --kv-cache-dtype (or use NGRAM).")
        self.device = target.device
        self.draft_path = draft_path
        # the target's dtype (a draft in another dtype would be converted by the loader); the KV in that dtype
        self.model_config = ModelConfig.from_pretrained(draft_path, dtype=target.model_config.dtype_name,
                                                        kv_cache_dtype="auto", device=self.device)
        self.is_head = algorithm != "STANDALONE"
        if not self.is_head:
            check_same_vocabulary(target.model_config, self.model_config, draft_path)
            if self.model_config.context_len < target.context_len:  # its rotary table ends at its own context
                raise ValueError(f"--speculative-draft-model-path {draft_path}: the draft model's context length is "
                                 f"{self.model_config.context_len} tokens, the target's {target.context_len}; pass "
                                 f"--context-length {self.model_config.context_len} (or a draft with a longer "
                                 "context).")
        cell = self.model_config.shape.kv_cell("auto", 1, self.model_config.dtype_name)
        if algorithm == "NEXTN":  # the config is the target's: the head's pool holds its MTP layer only
            from sglang.srt.models.deepseek_nextn import nextn_layer_count

            cell = dataclasses.replace(cell, num_layers=nextn_layer_count(self.model_config.hf_config))
        if cell.is_mla and not self.is_head:
            raise ValueError(f"--speculative-draft-model-path {draft_path}: an MLA draft model is not supported; "
                             "use a draft with standard attention.")
        with torch.no_grad(), single_rank_view():
            if self.is_head:
                self.model = self._load_head(target, algorithm, draft_path, tables)
            else:
                self.model = load_model(self.model_config, self.device)
        shared = tuple(getattr(self.model, "_shared", ())) if tables is not None else ()
        if target.tp_size > 1:
            check_unsharded((self.model, *shared))
        # a head's gathered tables are the draft's bytes (at tp=1 the target's own tables are shared, not counted)
        self.weight_bytes = _tensor_bytes(self.model, *shared)
        self.req_to_token_pool = target.req_to_token_pool
        # the same slot range as the target's pool: slot s of a request means the same position in both pools
        self.token_to_kv_pool = self._make_pool(target, cell)
        self.attn_backend = self._attention_backend(target)
        self.check_allocation(getattr(target, "memory_plan", None))
        logger.info("Draft %s %s: %.1f MiB of weights, KV pool %.1f MiB (%d B per token, %d slots)", algorithm,
                    draft_path, self.weight_bytes / 2**20, self.kv_bytes() / 2**20, cell.cell_bytes,
                    target.max_total_num_tokens)

    def _load_head(self, target, algorithm: str, path: str, tables: Optional[tuple]):
        """A hidden-state head over the target's embedding (and lm_head where it has none); its rotary table spans
        the target's context (a head's config often says 2,048 positions)."""
        from sglang.srt.model_executor.draft_head import build_head, check_head_fits

        cfg = self.model_config.hf_config
        check_head_fits(algorithm, cfg, target.model.config, path)
        target_positions = getattr(target.model.config, "max_position_embeddings", 0) or target.context_len
        cfg.max_position_embeddings = max(getattr(cfg, "max_position_embeddings", 0) or 0, target_positions)
        return build_head(algorithm, cfg, target.model, path, self.model_config.dtype, self.device, tables)

    def _make_pool(self, target, cell):
        """The draft's KV pool over the target's slot range: standard K/V, or an MLA latent pool for an MLA head
        (NEXTN). Zeroed: a prefix borrowed from the radix cache may hold a position whose draft KV was never written
        (the last proposal of a fully accepted step); the draft then reads zeros there, never NaN."""
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

        sa, dtype, layers = target.server_args, self.model_config.dtype, cell.num_layers
        if cell.is_mla:
            from sglang.srt.mem_cache.mla_pool import MLATokenToKVPool

            pool = MLATokenToKVPool(target.max_total_num_tokens, sa.page_size, dtype, cell.kv_lora_rank,
                                    cell.qk_rope_head_dim, layers, self.device)
            pool.kv_buffer.zero_()
            return pool
        pool = MHATokenToKVPool(target.max_total_num_tokens, sa.page_size, dtype, cell.num_kv_heads_per_rank,
                                self.model_config.head_dim, layers, self.device)
        pool.k_buffer.zero_()
        pool.v_buffer.zero_()
        return pool

    def _attention_backend(self, target):
        from sglang.srt.layers.attention.attention_registry import create_attention_backend
        from sglang.srt.mem_plan import build as B

        import dataclasses

        from sglang.srt.configs.resolved import fused_cpu_decode

        # the draft's geometry over the target's context and dtype, as the plan's draft_attention_workspace prices it
        facts = B.draft_facts(target.model_facts(), self.model_config.shape)
        # the device's facts, with whether the DRAFT's geometry decodes through the fused CPU kernel
        device = dataclasses.replace(target.device_facts(), fused_cpu_decode=fused_cpu_decode(facts, self.device))
        # unsharded, for every request-table row: a tree's beam decodes the slots' rows and the branch rows at once
        pool = target.req_to_token_pool
        inputs = B.draft_backend_inputs(target.server_args, target.model_facts(), device, self.model_config.shape,
                                        pool.size + pool.branch_rows)
        return create_attention_backend(target.server_args.attention_backend, model_config=self.model_config,
                                        req_to_token_pool=self.req_to_token_pool,
                                        token_to_kv_pool=self.token_to_kv_pool, device=self.device, inputs=inputs)

    def kv_bytes(self) -> int:
        return self.token_to_kv_pool.mem_usage_bytes()

    def check_allocation(self, plan) -> None:
        """The draft's KV pool and its attention backend's buffers hold exactly the plan's draft_kv_cache and
        draft_attention_workspace terms (when the plan prices them)."""
        planned = planned_term_bytes(plan, DRAFT_KV_TERM)
        if planned is not None:
            assert self.kv_bytes() == planned, (DRAFT_KV_TERM, self.kv_bytes(), planned)
        planned = planned_term_bytes(plan, DRAFT_WORKSPACE_TERM)
        if planned is not None:
            got = self.attn_backend.allocated_bytes()
            assert got == planned, (DRAFT_WORKSPACE_TERM, got, planned)
        # the weights are loaded after the plan (declared from config.json, not measured): say when they outgrow it
        planned = planned_term_bytes(plan, DRAFT_WEIGHTS_TERM)
        if planned is not None and self.weight_bytes > planned:
            logger.warning("The draft model's tensors hold %d B, the plan's %s term %d B; the safety margin absorbs "
                           "the difference.", self.weight_bytes, DRAFT_WEIGHTS_TERM, planned)

    def extend_argmax(self, pieces: Sequence[Tuple[int, List[int], int]]) -> List[int]:
        """One EXTEND forward of the draft over pieces (request table row, token ids, first position): each piece's
        tokens go into the slots its row records for those positions; returns the argmax after each piece."""
        rows = [row for row, _, _ in pieces]
        prefix = [start for _, _, start in pieces]
        lens = [len(ids) for _, ids, _ in pieces]
        seq_lens = [a + n for a, n in zip(prefix, lens)]
        ids = [t for _, piece, _ in pieces for t in piece]
        positions = [p for a, n in zip(prefix, lens) for p in range(a, a + n)]
        pool = self.req_to_token_pool
        fb = ForwardBatch(
            ForwardMode.EXTEND, len(pieces), input_ids=_int64(ids), positions=_int64(positions),
            req_pool_indices=_int64(rows), seq_lens=_int64(seq_lens),
            out_cache_loc=torch.cat([pool.slots(row, a, b) for row, a, b in zip(rows, prefix, seq_lens)]),
            seq_lens_cpu=seq_lens, req_pool_indices_cpu=rows, extend_prefix_lens_cpu=prefix, extend_seq_lens_cpu=lens,
            extend_prefix_lens=_int64(prefix), extend_seq_lens=_int64(lens), logits_indices=_int64(lens).cumsum(0) - 1,
        )
        return self.forward(fb).argmax(-1).tolist()

    def decode_argmax(self, rows: List[int], tokens: List[int], positions: List[int]) -> List[int]:
        """One DECODE forward: token i at positions[i] of row rows[i] (its KV into that position's slot)."""
        r2t = self.req_to_token_pool.req_to_token_host
        index = _int64(rows)
        seq_lens = [p + 1 for p in positions]
        fb = ForwardBatch(
            ForwardMode.DECODE, len(rows), input_ids=_int64(tokens), positions=_int64(positions),
            req_pool_indices=index, seq_lens=_int64(seq_lens), out_cache_loc=r2t[index, _int64(positions)],
            seq_lens_cpu=seq_lens, req_pool_indices_cpu=list(rows),
        )
        return self.forward(fb).argmax(-1).tolist()

    def _prepare(self, fb: ForwardBatch) -> None:
        move_to_device(fb, self.device)
        self.req_to_token_pool.sync_to_device()
        fb.req_to_token_pool = self.req_to_token_pool
        fb.token_to_kv_pool = self.token_to_kv_pool
        fb.attn_backend = self.attn_backend
        self.attn_backend.init_forward_metadata(fb)

    @torch.inference_mode()
    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        """Logits (float32) of the rows fb.logits_indices selects (decode: every row), from the draft model."""
        self._prepare(fb)
        with single_rank_view():  # its logits' all-gather is this rank's alone (module docstring)
            return self.model.forward(fb.input_ids, fb.positions, fb)

    @torch.inference_mode()
    def forward_head(self, fb: ForwardBatch, hidden_in: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """A head's forward: (float32 logits of fb.logits_indices' rows in the head's vocabulary, hidden_out [N, H])."""
        self._prepare(fb)
        with single_rank_view():
            return self.model.forward(fb.input_ids, fb.positions, fb, hidden_in.to(self.device))


def _int64(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def _tensor_bytes(*modules) -> int:
    """Bytes of the modules' parameters and buffers, each storage once (tied embeddings share one)."""
    storages = {(t.untyped_storage().data_ptr(), t.device): t.untyped_storage().nbytes()
                for m in modules for t in list(m.parameters()) + list(m.buffers())}
    return sum(storages.values())


def planned_term_bytes(plan, name: str) -> Optional[int]:
    if plan is None or not any(t.name == name for t in plan.terms):
        return None
    return plan.term(name).num_bytes

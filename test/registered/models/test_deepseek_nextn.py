"""NEXTN's head (models/deepseek_nextn.py): a DeepSeek-V3 checkpoint's MTP layer run over its own paged latent pool
equals the published MTP equations computed independently (sglang.test.deepseek_mtp.MTPReference: plain torch
around transformers' DeepseekV3 decoder layer, full causal attention over the whole sequence, no paged KV).

The head is fed as speculative decoding feeds it: two requests prefilled in chunks (the second chunk reads the first
one's latent rows from the pool), then decode steps, with random target features; every row's logits and hidden
state must equal the reference's rows of the same sequence. Also: the target loads the same checkpoint without its
MTP layer, the head's tensors are what the plan's draft_weights term declares (mem_plan/draft_heads.nextn_weights),
and a checkpoint without the MTP tensors, with more MTP layers than one, or quantized is refused, naming why."""

import copy

import pytest
import torch
from safetensors.torch import load_file

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.deepseek_mtp import HIDDEN, VOCAB, MTPReference, load_head, save_v3_with_mtp

register_cpu_ci(est_time=40, suite="cpu")

NUM_LAYERS = 2


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader import load_model

    path = save_v3_with_mtp(str(tmp_path_factory.mktemp("v3_mtp")), NUM_LAYERS)
    mc = ModelConfig.from_pretrained(path, dtype="float32", kv_cache_dtype="auto", device="cpu")
    target = load_model(mc, "cpu")
    return path, mc, target, load_head(target, mc)


class PagedHead:
    """The head over a one-layer latent pool and the torch_native backend, slots scattered (not position order)."""

    def __init__(self, head, mc, max_reqs: int = 4, slots: int = 256):
        from types import SimpleNamespace

        from sglang.srt.layers.attention.attention_registry import create_attention_backend
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
        from sglang.srt.mem_cache.mla_pool import MLATokenToKVPool
        from sglang.srt.mem_plan.backends import AttentionShape, BackendInputs
        from sglang.srt.server_args import ServerArgs

        cfg = mc.hf_config
        self.head, self.lens = head, {}
        self.r2t = ReqToTokenPool(max_reqs, 512, "cpu")
        self.pool = MLATokenToKVPool(slots, 1, torch.float32, cfg.kv_lora_rank, cfg.qk_rope_head_dim, 1, "cpu")
        width = cfg.kv_lora_rank + cfg.qk_rope_head_dim
        shape = AttentionShape(cfg.num_attention_heads, width, 512, v_head_dim=cfg.kv_lora_rank, is_mla=True,
                               num_kv_heads=1, model_dtype_bytes=4, kv_dtype_bytes=4,
                               num_kv_splits=ServerArgs.triton_attention_num_kv_splits)
        self.backend = create_attention_backend("torch_native", model_config=SimpleNamespace(dtype=torch.float32),
                                                req_to_token_pool=self.r2t, token_to_kv_pool=self.pool, device="cpu",
                                                inputs=BackendInputs(shape, max_reqs, 0))
        self.free = list(torch.randperm(slots - 1, generator=torch.Generator().manual_seed(0)) + 1)

    def new_request(self) -> int:
        row = self.r2t.alloc()
        self.lens[row] = 0
        return row

    def step(self, rows, tokens, features):
        """tokens[b]: the next rows of request rows[b] (a DECODE batch when each has one and a prefix) ->
        (logits of every row, hidden_out), float32."""
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

        prefix = [self.lens[r] for r in rows]
        n = [len(t) for t in tokens]
        locs = []
        for row, p, k in zip(rows, prefix, n):
            slots = [int(self.free.pop()) for _ in range(k)]
            self.r2t.req_to_token[row, p: p + k] = torch.tensor(slots)
            self.lens[row] = p + k
            locs += slots
        seq = [p + k for p, k in zip(prefix, n)]
        decode = all(k == 1 for k in n) and all(p > 0 for p in prefix)
        i64 = lambda v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
        fb = ForwardBatch(
            ForwardMode.DECODE if decode else ForwardMode.EXTEND, len(rows),
            input_ids=i64([t for ts in tokens for t in ts]),
            positions=torch.cat([torch.arange(p, s) for p, s in zip(prefix, seq)]),
            req_pool_indices=i64(rows), seq_lens=i64(seq), out_cache_loc=i64(locs), seq_lens_cpu=seq,
            req_pool_indices_cpu=list(rows), extend_prefix_lens_cpu=[] if decode else prefix,
            extend_seq_lens_cpu=[] if decode else n, extend_prefix_lens=None if decode else i64(prefix),
            extend_seq_lens=None if decode else i64(n), logits_indices=torch.arange(sum(n)),
            req_to_token_pool=self.r2t, token_to_kv_pool=self.pool, attn_backend=self.backend)
        self.r2t.sync_to_device()
        self.backend.init_forward_metadata(fb)
        return self.head(fb.input_ids, fb.positions, fb, torch.cat(features))


def test_head_equals_published_mtp_equations(loaded):
    path, mc, _, head = loaded
    ref = MTPReference(path)
    gen = torch.Generator().manual_seed(1)
    lens = (19, 13)
    seqs = [torch.randint(0, VOCAB, (n,), generator=gen) for n in lens]
    feats = [torch.randn(n, HIDDEN, generator=gen) for n in lens]
    want = [ref(s, f) for s, f in zip(seqs, feats)]
    driver = PagedHead(head, mc)
    rows = [driver.new_request(), driver.new_request()]
    # (request's rows this step) per request: chunked extends, then decode steps, then a 3-row step (a verify-like
    # catch-up reading the decoded rows' latent KV)
    plan = [((0, 7), (0, 5)), ((7, 12), (5, 9)), ((12, 13), (9, 10)), ((13, 14), (10, 11)), ((14, 17), (11, 13)),
            ((17, 19), None)]
    for step in plan:
        active = [(i, span) for i, span in enumerate(step) if span is not None]
        logits, hidden = driver.step([rows[i] for i, _ in active],
                                     [seqs[i][a:b].tolist() for i, (a, b) in active],
                                     [feats[i][a:b] for i, (a, b) in active])
        start = 0
        for i, (a, b) in active:
            ref_logits, ref_hidden = want[i]
            got_l, got_h = logits[start: start + b - a], hidden[start: start + b - a]
            torch.testing.assert_close(got_h, ref_hidden[a:b], atol=2e-4, rtol=2e-4, msg=f"hidden {i} [{a}, {b})")
            torch.testing.assert_close(got_l, ref_logits[a:b], atol=2e-3, rtol=2e-4, msg=f"logits {i} [{a}, {b})")
            start += b - a
    # the rows are not degenerate: the head's argmax differs between rows, and depends on the feature
    assert len(set(want[0][0].argmax(-1).tolist())) > 5
    other = ref(seqs[0], feats[0] * 0 + 1)[0].argmax(-1)
    assert (other != want[0][0].argmax(-1)).any()


def test_target_skips_mtp_and_head_weights_match_plan(loaded):
    from sglang.srt.mem_plan.draft_heads import groups_bytes, nextn_weights
    from sglang.srt.mem_plan.model_shapes import load_config

    path, _, target, head = loaded
    ckpt = load_file(f"{path}/model.safetensors")
    mtp = f"model.layers.{NUM_LAYERS}."
    assert len(target.model.layers) == NUM_LAYERS
    assert "last" in target.hidden_capture_modes()  # the target hands its final-normed rows to the head
    # the head's tensors are the checkpoint's MTP tensors (the experts stacked; kv_b_proj rearranged per head)
    torch.testing.assert_close(head.eh_proj.weight, ckpt[mtp + "eh_proj.weight"], rtol=0, atol=0)
    torch.testing.assert_close(head.decoder.self_attn.q_a_proj.weight, ckpt[mtp + "self_attn.q_a_proj.weight"],
                               rtol=0, atol=0)
    torch.testing.assert_close(head.decoder.mlp.gate.e_score_correction_bias,
                               ckpt[mtp + "mlp.gate.e_score_correction_bias"], rtol=0, atol=0)
    # the embedding and lm_head are the target's, not held twice
    names = {n for n, _ in head.named_parameters()}
    assert not any("embed" in n or "lm_head" in n for n in names)
    assert head._shared[1] is target.lm_head
    held = sum(p.numel() * p.element_size() for p in head.parameters())
    assert held == groups_bytes(nextn_weights(load_config(path)), 4)


def test_refused_without_mtp_tensors_two_layers_or_quantized(loaded):
    from sglang.srt.models.deepseek_nextn import DeepseekNextN

    path, mc, target, _ = loaded
    ckpt = load_file(f"{path}/model.safetensors")
    head = DeepseekNextN(mc.hf_config, target)
    partial = {k: v for k, v in ckpt.items() if "eh_proj" not in k}
    with pytest.raises(ValueError, match=r"model\.layers\.2\.\* for \['eh_proj\.weight'\]"):
        head.load_weights(partial.items())
    two = copy.copy(mc.hf_config)
    two.num_nextn_predict_layers = 2
    with pytest.raises(ValueError, match="num_nextn_predict_layers 2"):
        DeepseekNextN(two, target)
    none = copy.copy(mc.hf_config)
    none.num_nextn_predict_layers = 0
    with pytest.raises(ValueError, match="ships no MTP layer"):
        DeepseekNextN(none, target)
    fp8 = copy.copy(mc.hf_config)
    fp8.quantization_config = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    with pytest.raises(ValueError, match="quantized"):
        DeepseekNextN(fp8, target)

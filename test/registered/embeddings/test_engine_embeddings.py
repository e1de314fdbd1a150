"""Engine.encode (--is-embedding) against HF transformers in float32: the final hidden state (AutoModel's
last_hidden_state) pooled the same way (last token, or the mean when the checkpoint's sentence-transformers Pooling
config says so) and L2-normalized. A random-weight Qwen3 checkpoint (both poolings, prompts across a chunk boundary,
text and token-id inputs) and the default model; the embedding server keeps no KV after a request, plans no sampler
rows, and refuses generation."""

import json
import os

import pytest
import torch

from sglang import Engine
from sglang.srt.mem_plan.sizes import pooled_bytes_per_slot
from sglang.srt.sampling.validation import ParamError
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import PROMPTS, assert_idle_and_intact, default_model_dir, make_random_qwen3, shutdown

register_cpu_ci(est_time=40, suite="cpu")

MIN_COSINE = 0.9999


def hf_pooled(model_dir, prompts_ids, pooling):
    from transformers import AutoModel

    model = AutoModel.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for ids in prompts_ids:
            h = model(torch.tensor([ids])).last_hidden_state[0]
            v = h[-1] if pooling == "last" else h.mean(0)
            out.append(torch.nn.functional.normalize(v, dim=0))
    return out


def cosines(ours, ref):
    return [float(torch.dot(torch.tensor(a["embedding"]), b)) for a, b in zip(ours, ref)]


def write_pooling_config(path, mean: bool):
    with open(os.path.join(path, "modules.json"), "w") as f:
        json.dump([{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                   {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}], f)
    os.makedirs(os.path.join(path, "1_Pooling"), exist_ok=True)
    with open(os.path.join(path, "1_Pooling", "config.json"), "w") as f:
        json.dump({"word_embedding_dimension": 128, "pooling_mode_mean_tokens": mean,
                   "pooling_mode_lasttoken": not mean, "pooling_mode_cls_token": False}, f)


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_random_qwen3_matches_hf(tmp_path, pooling):
    path = make_random_qwen3(str(tmp_path / "qwen3"))
    if pooling == "mean":
        write_pooling_config(path, mean=True)
    # 40 and 70 tokens cross the 32-token chunk: the chunks' sums (mean) and the last chunk's row (last) are pooled
    prompts = [[5, 17, 300, 42, 9], [100, 200, 300], list(range(20, 60)), [(7 * i) % 500 + 3 for i in range(70)]]
    ref = hf_pooled(path, prompts, pooling)
    engine = Engine(model_path=path, dtype="float32", skip_tokenizer_init=True, max_total_memory_gb=1,
                    chunked_prefill_size=32, is_embedding=True, log_level="warning")
    try:
        assert engine.scheduler.model_runner.pooling == pooling
        outs = engine.encode(prompts)
        assert len(outs) == len(prompts)
        for o, ids, r in zip(outs, prompts, ref):
            assert o["meta_info"]["prompt_tokens"] == len(ids)
            assert len(o["embedding"]) == 128
            assert torch.allclose(torch.tensor(o["embedding"]), r, atol=2e-5), pooling
        assert min(cosines(outs, ref)) >= MIN_COSINE
        one = engine.encode(prompts[2])  # a token-id list is one input: one result, not a batch
        assert isinstance(one, dict) and torch.allclose(torch.tensor(one["embedding"]), ref[2], atol=2e-5)
        assert_idle_and_intact(engine)  # no KV kept: every slot back in the pool, no prefix cache
        assert engine.scheduler.tree_cache is None
        plan = engine.get_server_info()["memory_plan"]
        logits = next(t for t in plan["terms"] if t["name"] == "logits")
        assert logits["num_bytes"] == pooled_bytes_per_slot(128) * plan["max_running_requests"]
        assert next(t for t in plan["terms"] if t["name"] == "grammar")["num_bytes"] == 0
        with pytest.raises(ParamError, match="--is-embedding"):
            engine.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 2})
        with pytest.raises(ParamError, match="prompt"):
            engine.encode([])
    finally:
        shutdown(engine)


def test_default_model_matches_hf():
    engine = Engine(dtype="float32", max_total_memory_gb=2, chunked_prefill_size=64, is_embedding=True,
                    log_level="warning")
    try:
        tok = engine.tokenizer
        texts = PROMPTS + [" ".join(PROMPTS * 2)]  # the last is longer than the 64-token chunk
        ids = [tok(t)["input_ids"] for t in texts]
        assert len(ids[-1]) > 64
        ref = hf_pooled(default_model_dir(), ids, "last")
        outs = engine.encode(texts)
        assert min(cosines(outs, ref)) >= MIN_COSINE
        assert [o["meta_info"]["prompt_tokens"] for o in outs] == [len(i) for i in ids]
        assert cosines([engine.encode(ids[0])], ref[:1])[0] >= MIN_COSINE  # token ids: the same vector
        assert_idle_and_intact(engine)
    finally:
        shutdown(engine)


def test_generative_engine_refuses_encode():
    from sglang.srt.managers.request_kind import NOT_EMBEDDING_MESSAGE

    class Stub:  # encode's first check needs only the server args (a generative engine: any other test's)
        server_args = type("A", (), {"is_embedding": False})()
        _check_kind = Engine._check_kind

    with pytest.raises(ParamError, match="--is-embedding"):
        Engine.encode(Stub(), "hello")
    assert "--is-embedding" in NOT_EMBEDDING_MESSAGE


def test_tp_batch_carries_pooling():
    """With --tp-size N the followers run the batch rank 0 packs: they must pool too (else they would all-gather
    logits while rank 0 does not)."""
    from sglang.srt.distributed.batch_sync import pack_forward_batch, unpack_forward_batch
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

    t = lambda *v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
    r2t = torch.zeros(4, 16, dtype=torch.int64)
    r2t[1, :3] = t(5, 6, 7)
    fb = ForwardBatch(ForwardMode.EXTEND, 1, input_ids=t(1, 2, 3), positions=t(0, 1, 2), req_pool_indices=t(1),
                      seq_lens=t(3), out_cache_loc=t(5, 6, 7), seq_lens_cpu=[3], req_pool_indices_cpu=[1],
                      extend_prefix_lens_cpu=[0], extend_seq_lens_cpu=[3], extend_prefix_lens=t(0),
                      extend_seq_lens=t(3), pooling="mean")
    assert unpack_forward_batch(pack_forward_batch(fb, r2t), torch.zeros(4, 16, dtype=torch.int64)).pooling == "mean"

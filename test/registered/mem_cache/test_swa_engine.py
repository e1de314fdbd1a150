"""The windowed KV pool served (issue 41), through sglang.Engine on two random fp32 models with a 16-token window:
Mistral (every layer windowed: the windowed pool is the token pool) and Gemma 3 (one full layer of four: a full pool,
a windowed pool and the slot map between them). Greedy tokens equal HF transformers' for prompts 3x the window,
prefilled in 24-token chunks that cut the window edge, with a decode OOM that retracts half the batch; the windowed
tokens in use stay within slots x (window + chunk + page) through a long generation (the pages the window left are
freed after every forward); the start allocates what the plan says; free + owned == total for both pools."""

import contextlib
import io
import json

import pytest
import torch

from sglang.srt.mem_plan.layer_pools import request_pool_tokens
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import spread_random_weights

register_cpu_ci(est_time=150, suite="cpu")

WINDOW, PAGE, CHUNK, VOCAB = 16, 4, 24, 512
GREEDY = {"temperature": 0, "ignore_eos": True}


def _prompts(n, length, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, VOCAB, (length - 3 * i,), generator=g).tolist() for i in range(n)]


def _mistral():
    from transformers import MistralConfig, MistralForCausalLM

    cfg = MistralConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024,
                        sliding_window=WINDOW, tie_word_embeddings=False, eos_token_id=1, bos_token_id=0)
    return MistralForCausalLM(cfg)


def _gemma3():
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    cfg = Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=1024, sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 1e4}},
        eos_token_id=1, bos_token_id=0, pad_token_id=0, attn_implementation="eager")
    return Gemma3ForCausalLM(cfg)


@pytest.fixture(scope="module", params=["mistral", "gemma3"])
def hf_model(request, tmp_path_factory):
    torch.manual_seed(0)
    model = spread_random_weights({"mistral": _mistral, "gemma3": _gemma3}[request.param]().float()).eval()
    path = str(tmp_path_factory.mktemp(request.param) / "m")
    model.save_pretrained(path)
    return model, path


@pytest.fixture(scope="module")
def engine(hf_model, monkeypatch_module):
    from sglang import Engine

    # the 12th decode batch runs out of memory: half the batch is retracted and prefills its window again
    monkeypatch_module.setenv("SGLANG_FAULT_INJECT", "decode:oom:at=12,limit=1")
    e = Engine(model_path=hf_model[1], dtype="float32", log_level="warning", skip_tokenizer_init=True,
               chunked_prefill_size=CHUNK, page_size=PAGE, max_total_memory_gb=1)
    yield e
    e.shutdown()


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def _hf_greedy(model, prompt, n):
    with torch.no_grad():
        x = torch.tensor([prompt])
        y = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n,
                           min_new_tokens=n, pad_token_id=0)
    return y[0, len(prompt):].tolist()


def _windowed(engine):
    return engine.get_server_info()["kv_cache"]


def test_greedy_equals_hf_past_the_window_with_retraction(engine, hf_model):
    prompts = _prompts(4, 3 * WINDOW, seed=1)  # 48, 45, 42, 39 tokens: two chunks each, the cut inside the window
    outs = engine.generate(input_ids=prompts, sampling_params=dict(GREEDY, max_new_tokens=24))
    assert engine.scheduler.num_retractions >= 1  # the injected decode OOM retracted requests, which re-prefilled
    for p, o in zip(prompts, outs):
        assert o["output_ids"] == _hf_greedy(hf_model[0], p, 24)
    engine.scheduler.check_integrity()
    # what the requests left is the prefix cache's (its windowed pages too); flushed, the pool is empty
    assert _windowed(engine)["windowed_pages_in_use"] > 0 and engine.flush_cache()
    assert _windowed(engine)["windowed_pages_in_use"] == 0


def test_windowed_pages_bounded_through_a_long_generation(engine, hf_model):
    """A request holds its window, not its history: the most windowed tokens ever in use stays within slots x
    (window + chunk + page), while each request's sequence grows far past that."""
    prompts, new = _prompts(4, 3 * WINDOW, seed=2), 120
    sched, seen = engine.scheduler, []
    step = sched.step

    def sampled_step():  # /server_info's figure after every scheduler step
        out = step()
        seen.append(_windowed(engine)["windowed_tokens_in_use"])
        return out

    sched.step = sampled_step
    try:
        outs = engine.generate(input_ids=prompts, sampling_params=dict(GREEDY, max_new_tokens=new))
    finally:
        del sched.step
    bound = len(prompts) * (WINDOW + CHUNK + PAGE)
    info = _windowed(engine)
    assert len(seen) > new and max(seen) > 0
    # ... far below what the requests would hold keeping every token (672)
    assert max(seen) <= info["windowed_tokens_in_use_max"] <= bound < len(prompts) * (3 * WINDOW + new) // 2
    assert outs[0]["output_ids"] == _hf_greedy(hf_model[0], prompts[0], new)
    sched.check_integrity()
    print(f"windowed tokens in use: max sampled {max(seen)}, max at allocation {info['windowed_tokens_in_use_max']}, "
          f"bound {bound}")


def test_prefix_hit_borrows_the_window(engine, hf_model):
    """A cached prefix whose window is still held is a hit (mem_cache/swa_radix_cache.py): the request borrows it,
    prefills the rest in chunks past the window edge, and decodes HF's tokens; a later request of the same prompt
    hits too."""
    base = _prompts(1, WINDOW, seed=3)[0]  # 16 tokens: nothing leaves the window before it is cached
    engine.generate(input_ids=[base], sampling_params=dict(GREEDY, max_new_tokens=1))
    longer = base + _prompts(1, 3 * WINDOW, seed=4)[0]
    for _ in range(2):
        out = engine.generate(input_ids=[longer], sampling_params=dict(GREEDY, max_new_tokens=12))[0]
        assert out["meta_info"]["cached_tokens"] >= WINDOW
        assert out["output_ids"] == _hf_greedy(hf_model[0], longer, 12)
        engine.scheduler.check_integrity()


def test_start_allocates_the_plan(engine):
    """The pools are what the plan charged: without full layers the windowed pool is the token pool; with them a
    full pool of T tokens, a windowed pool of T_w and an int32 map over the token pool's rows."""
    runner = engine.scheduler.model_runner
    plan, alloc, got = runner.memory_plan, runner.token_to_kv_pool_allocator, runner.allocated_bytes()
    assert alloc.size == plan.max_total_num_tokens and alloc.windowed_size == plan.windowed_tokens > 0
    for term in ("kv_cache", "kv_windowed", "kv_windowed_map"):
        assert got[term] == plan.bytes_of(term), term
    if alloc.windowed_only:
        assert plan.windowed_tokens == plan.max_total_num_tokens
        assert plan.bytes_of("kv_cache") == plan.bytes_of("kv_windowed_map") == 0
        assert plan.window_slot_tokens == request_pool_tokens(WINDOW, PAGE, runner.context_len)
    else:
        assert plan.windowed_tokens < plan.max_total_num_tokens
        assert got["kv_windowed_map"] == (plan.max_total_num_tokens + PAGE) * 4
        assert got["kv_cache"] > 0


def test_dry_run_plans_the_start(engine, hf_model):
    """`sglang plan` with the same flags predicts the start's pools: the token pool and the windowed pool within 3%
    (the start measures weights and activations, the dry run uses formulas), the same terms."""
    from sglang.cli.plan import main as plan_main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        status = plan_main(["--device", "cpu", "--model-path", hf_model[1], "--dtype", "float32",
                            "--max-total-memory-gb", "1", "--chunked-prefill-size", str(CHUNK),
                            "--page-size", str(PAGE), "--json"])
    assert status == 0
    planned, served = json.loads(buf.getvalue())["plan"], engine.get_server_info()["memory_plan"]
    assert [t["name"] for t in planned["terms"]] == [t["name"] for t in served["terms"]]
    for key in ("max_total_num_tokens", "windowed_tokens"):
        assert abs(planned[key] - served[key]) <= 0.03 * served[key], (key, planned[key], served[key])
    print(f"plan vs start: T {planned['max_total_num_tokens']} / {served['max_total_num_tokens']}, "
          f"T_w {planned['windowed_tokens']} / {served['windowed_tokens']}")


def test_served_windowed_models_exist():
    """Every model_type served with its sliding layers has a model implementation; chunked layers stay refused."""
    from sglang.srt.mem_plan.arch_registry import SERVED_WITH_WINDOWS, not_served_note
    from sglang.srt.models.registry import MODEL_REGISTRY

    for model_type, arch in SERVED_WITH_WINDOWS.items():
        assert arch in MODEL_REGISTRY
        assert not_served_note(model_type, ("full", "sliding")) == ""
        assert "chunked" in not_served_note(model_type, ("full", "chunked"))

"""bf16 logprobs of MoE checkpoints within a stated tolerance of HF transformers.

The engine serves the random-weight Qwen3-MoE and Mixtral checkpoints (moe_fixtures.py) in bf16 and returns the
logprob of every greedy token; the reference is HF transformers run in fp32 on the same bf16 weights (the fp32
checkpoint rounded to bf16, as the engine loads it), teacher-forced on the engine's tokens, so every position is
compared even after a near-tie flips a token. On a CPU whose sgl-kernel kernels load, Qwen3-MoE's experts (K 64,
N 32) run the fused CPU kernel and Mixtral's (N 48, not a multiple of 32) the torch path, so both bf16
implementations are covered; one prompt is longer than the chunk (chunked prefill).

Measured on a 2-core AVX-512 BF16 EPYC (8 prompts x 16 tokens, logprobs around -4 to -5 nats): max |engine - HF|
0.120 nats (Qwen3-MoE) and 0.062 (Mixtral), mean 0.0078 and 0.0052; HF transformers itself run in bf16 is as far
from the same reference (max 0.128 / 0.062, mean 0.0080 / 0.0052). The tolerances leave about 2x: max
BF16_LOGPROB_TOLERANCE = 0.25, mean BF16_LOGPROB_MEAN_TOLERANCE = 0.02. Checked to fail when the router skips its
renormalisation (Qwen3-MoE) or a token loses one of its experts.
"""

import gc

import pytest
import torch

from sglang import Engine
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import shutdown
from sglang.test.moe_fixtures import VOCAB_SIZE, make_random_mixtral, make_random_qwen3_moe

register_cpu_ci(est_time=25, suite="cpu")

CHUNK = 32
NEW_TOKENS = 16
BF16_LOGPROB_TOLERANCE = 0.25
BF16_LOGPROB_MEAN_TOLERANCE = 0.02
PROMPTS = [[(37 * i + 11 * j + 5) % VOCAB_SIZE for j in range(5 + 3 * i)] for i in range(7)]
PROMPTS.append([(29 * j + 1) % VOCAB_SIZE for j in range(3 * CHUNK + 7)])  # chunked prefill
MAKERS = {"qwen3_moe": make_random_qwen3_moe, "mixtral": make_random_mixtral}


def hf_logprobs(path: str, prompts, outputs) -> list:
    """HF fp32 on the bf16-rounded weights: log-softmax at each generated position of prompt + output."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
        out = []
        for prompt, tokens in zip(prompts, outputs):
            ids = torch.tensor([prompt + tokens])
            logits = model(ids, attention_mask=torch.ones_like(ids)).logits[0].float()
            lp = torch.log_softmax(logits[len(prompt) - 1: -1], dim=-1)
            out.append((lp[torch.arange(len(tokens)), tokens].tolist(), lp.max(-1).values.tolist()))
    del model
    gc.collect()
    return out


@pytest.fixture(scope="module", params=list(MAKERS))
def served(request, tmp_path_factory):
    path = MAKERS[request.param](str(tmp_path_factory.mktemp(request.param) / "m"))
    engine = Engine(model_path=path, dtype="bfloat16", skip_tokenizer_init=True, chunked_prefill_size=CHUNK,
                    max_total_memory_gb=0.5, log_level="warning", random_seed=0)
    try:
        outs = engine.generate(input_ids=PROMPTS, sampling_params={"temperature": 0, "max_new_tokens": NEW_TOKENS,
                                                                   "ignore_eos": True}, return_logprob=True)
        impls = {m.impl for m in engine.scheduler.model_runner.model.modules() if hasattr(m, "fused_experts")}
    finally:
        shutdown(engine)
    tokens = [o["output_ids"] for o in outs]
    ours = [[lp for lp, _, _ in o["meta_info"]["output_token_logprobs"]] for o in outs]
    for o, t in zip(outs, tokens):
        assert [tok for _, tok, _ in o["meta_info"]["output_token_logprobs"]] == t
    return request.param, impls, tokens, ours, hf_logprobs(path, PROMPTS, tokens)


def test_bf16_logprobs_within_tolerance_of_hf(served):
    arch, impls, tokens, ours, ref = served
    diffs = [abs(a - b) for got, (want, _) in zip(ours, ref) for a, b in zip(got, want)]
    assert len(diffs) == len(PROMPTS) * NEW_TOKENS
    print(f"{arch} ({impls}): max |engine - HF| {max(diffs):.4f}, mean {sum(diffs) / len(diffs):.5f} nats")
    assert max(diffs) <= BF16_LOGPROB_TOLERANCE, max(diffs)
    assert sum(diffs) / len(diffs) <= BF16_LOGPROB_MEAN_TOLERANCE, sum(diffs) / len(diffs)


def test_each_bf16_implementation_is_covered(served):
    from sglang.srt.configs.resolved import cpu_kernels_available

    arch, impls, _, _, _ = served
    assert impls == ({"cpu" if arch == "qwen3_moe" else "torch"} if cpu_kernels_available("cpu") else {"torch"})


def test_greedy_tokens_are_hf_argmax_up_to_the_tolerance(served):
    """Each greedy token is HF's most likely token, or within the tolerance of it (a bf16 near-tie)."""
    _, _, tokens, _, ref = served
    for want, best in ref:
        for lp, top in zip(want, best):
            assert top - lp <= BF16_LOGPROB_TOLERANCE, (lp, top)

"""The default CPU start serves the bundled model from its Q4_1 blocks, through sglang.Engine and the HTTP server.

Checked: /server_info and Engine.get_server_info report quantization 'gguf'; the plan's weights term is the
quantized size (measured from the loaded tensors: packed Q4_1 linears + the file's Q8_0 embedding table, packed
too, well under the dense bf16 model's 287 MiB), and `sglang plan`'s weights formula is exactly the served model's
tensor bytes (+ the load's residual); the tied embedding / lm_head is one packed table (layers/quantization/
vocab_method.py): the embedding returns exactly the rows the gguf package dequantizes (what the dense bf16 table
held), and the logits agree with that dense table's (the previous start's lm_head, the rest of the model the same)
on >= 95% of positions, teacher-forced; greedy text from the Engine equals the HTTP server's (same kernels, one
request at a time), and chat through the `openai` client answers; a greedy decode batch's tokens come from the
packed lm_head's fused argmax and equal the sampler's choice from the logits (prefill batches:
test_quant_greedy_prefill.py); the flag rules at startup. Output quality against
the dense model is test_quant_quality.py's.
"""

import contextlib
import io
import json

import numpy as np
import pytest
import requests
import torch

from sglang import Engine
from sglang.cli.plan import main as plan_main
from sglang.jit_kernel.cpu_ops import cpu_kernels_expected
from sglang.srt.layers.linear import linear
from sglang.srt.layers.quantization import resolve_quantization
from sglang.srt.layers.quantization.linear_method import quant_kernels
from sglang.srt.mem_plan.model_shapes import CPU_PACKED_LOAD_RESIDUAL_BYTES
from sglang.srt.utils.hf_transformers_utils import apply_chat_template, get_tokenizer
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.tensor_bytes import tensor_bytes
from sglang.test.engine_fixtures import assert_idle_and_intact, default_model_dir, shutdown
from sglang.test.quant_fixtures import ONE_PASS_PATH, one_pass_bound
from sglang.test.test_utils import DEFAULT_SMALL_SERVER_ARGS, openai_client, popen_launch_server
from sglang.test.top1_agreement import greedy_runs, teacher_forced_agreement

register_cpu_ci(est_time=25, suite="cpu")

PROMPTS = ["The three primary colors are", "Write a haiku about the ocean.\n", "def fibonacci(n):"]
SAMPLING = {"temperature": 0.0, "max_new_tokens": 24}
MIB = 2**20
# the default start serves Q4_1 only where quant_linear runs (without it the dense path is faster)
needs_kernels = pytest.mark.skipif(not cpu_kernels_expected() or " avx512_vnni" not in open("/proc/cpuinfo").read(),
                                   reason="no AVX-512 VNNI/BF16 kernels here: the default start stays dense")


@pytest.fixture(scope="module")
def engine():
    eng = Engine(max_total_memory_gb=3, log_level="warning")
    yield eng
    shutdown(eng)


AGREEMENT_PROMPTS = [
    "Tell me a joke about cats.", "Write a haiku about the ocean.", "List three uses of a paperclip.",
    "Explain photosynthesis in one sentence.", "What is 17 plus 25?", "Translate 'good morning' into Spanish.",
    "Give me a name for a pet turtle.", "Why is the sky blue?", "Write a short story about a robot who paints.",
    "Describe a sunset over the mountains.", "How do airplanes stay in the air?", "Summarize the water cycle.",
    "What should I cook for dinner tonight?", "Explain recursion to a child.", "Write a limerick about a frog.",
    "Give three tips for learning a new language.",
]
AGREEMENT_TOKENS = 24


def weights_term_bytes(info: dict) -> int:
    terms = info["memory_plan"]["terms"]
    return next(t["num_bytes"] for t in terms if t["name"] == "weights")


@pytest.fixture(scope="module")
def file_table(engine) -> torch.Tensor:
    """The served file's token_embd.weight as the gguf package dequantizes it: float32 [vocab, hidden]."""
    import gguf
    from gguf.quants import dequantize

    path = engine.scheduler.model_runner.gguf_path
    t = next(t for t in gguf.GGUFReader(path).tensors if t.name == "token_embd.weight")
    rows, cols = (int(d) for d in reversed(t.shape.tolist()))
    return torch.from_numpy(dequantize(t.data, t.tensor_type).astype(np.float32).reshape(rows, cols).copy())



@needs_kernels
def test_default_start_serves_q4_1_blocks(engine):
    info = engine.get_server_info()
    assert info["quantization"] == "gguf" and info["dtype"] == "bfloat16"
    # packed Q4_1 (30 layers: 64.3 MiB) + the packed Q8_0 embedding / lm_head table (30.4 MiB) + norms and the rope
    # table: 94.7 MiB of tensors (118.3 MiB with the table dense in bf16); the dense bf16 model holds 287 MiB
    assert 94 * MIB < weights_term_bytes(info) < 112 * MIB, weights_term_bytes(info)


@needs_kernels
def test_tied_embedding_and_lm_head_are_one_packed_table(engine, file_table):
    runner = engine.scheduler.model_runner
    model, emb, head = runner.model, runner.model.model.embed_tokens, runner.model.lm_head
    assert emb.quant_bits == 8 and emb.weight is None  # the file's Q8_0 token_embd blocks
    assert head.weight is None and head._tied_table == (emb,)
    table = file_table
    vocab, hidden = table.shape
    dense = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.numel() >= vocab * hidden // 4]
    assert dense == ["model.embed_tokens.qweight"], dense  # the one copy, packed
    ids = torch.tensor([0, 1, 15, 16, 17, 1000, vocab - 1, 1000])
    assert torch.equal(emb(ids), table[ids].to(torch.bfloat16))  # exactly what the dense bf16 table held
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert plan_main(["--device", "cpu", "--max-total-memory-gb", "3", "--json"]) == 0, buf.getvalue()
    weights = next(t for t in json.loads(buf.getvalue())["plan"]["terms"] if t["name"] == "weights")["num_bytes"]
    assert weights - CPU_PACKED_LOAD_RESIDUAL_BYTES == tensor_bytes(model), (weights, tensor_bytes(model))


@needs_kernels
def test_packed_lm_head_agrees_with_the_dense_table(engine, file_table):
    """The previous start's lm_head (LogitsProcessor's linear() on the dense bf16 table) gives the reference runs;
    the served packed table must pick the same token at >= 95% of those positions, teacher-forced
    (test_moe_gguf_quant.py's measure; measured 99.0% with the dense AMX path from 32 rows, 97.1% with the int8 paths
    alone). That measure also counts where one prefill and the decode steps that made the runs differ: the dense
    lm_head reading its own runs agrees on 96.9% (measured once, not run here). On the very hidden states of that
    prefill the packed table is held to the dense bf16 table's fp32 product: the int8 paths differ from it by the
    activations' rounding (measured 99.5% top-1 agreement, max |error| 0.64% of the largest logit), the dense AMX
    path (bf16 activations times the table's weights rounded to bf16, as the dense table holds them) by fp32
    summation order alone (measured 100%, 0.00%). Without AMX the packed table takes one int8 pass of activations
    (quant_head_one_pass; measured 98.2% teacher-forced, 99.0% on the same hidden states, max error 1.5%): each logit
    is held to its own bound there, one_pass_bound from the file's table plus the dense table's bf16 rounding."""
    runner = engine.scheduler.model_runner
    model, config = runner.model, runner.model_config
    tok = get_tokenizer(default_model_dir())
    prompts = [apply_chat_template(tok, [{"role": "user", "content": p}], tokenize=True) for p in AGREEMENT_PROMPTS]
    dense = file_table.to(torch.bfloat16)
    model.lm_head.logits = lambda h: linear(h, dense)
    try:
        runs = greedy_runs(model, config, prompts, AGREEMENT_TOKENS)
    finally:
        del model.lm_head.logits
    packed, hidden = model.lm_head.logits, []

    def packed_lm_head(h):
        hidden.append(h)
        return packed(h)

    model.lm_head.logits = packed_lm_head
    try:
        rate = teacher_forced_agreement(model, config, prompts, runs)
    finally:
        del model.lm_head.logits
    with torch.inference_mode():
        # the dense table's product in fp32 (linear's bf16 output would round near-ties of the largest logit into
        # exact ties, which its argmax breaks by index)
        want, got = linear(hidden[0].float(), dense.float()), model.lm_head.logits(hidden[0]).float()
    same = (want.argmax(-1) == got.argmax(-1)).float().mean().item()
    err = ((got - want).abs().max() / want.abs().max()).item()
    print(f"packed Q8_0 lm_head vs the dense bf16 table: top-1 agreement {rate:.3f}, on the same hidden states "
          f"{same:.3f}, max error {err:.4f} of the largest logit ({len(prompts) * AGREEMENT_TOKENS} positions)")
    assert rate >= 0.95
    ops = quant_kernels()
    if ops is not None and ops.quant_path(len(hidden[0]), head=True) == ONE_PASS_PATH:
        h, table = hidden[0].double(), file_table.double()
        bound = one_pass_bound(h, table) + h.abs() @ (table - dense.double()).abs().T
        assert ((got - want).abs().double() <= bound).all(), ((got - want).abs().double() / bound).max()
        assert same >= 0.98
    else:
        assert same >= 0.99 and err < 1e-2


@needs_kernels
def test_engine_and_http_server_give_the_same_greedy_text(engine):
    engine_texts = [engine.generate(p, dict(SAMPLING))["text"] for p in PROMPTS]
    assert all(len(t) > 10 for t in engine_texts)
    assert_idle_and_intact(engine)
    srv = popen_launch_server(other_args=[*DEFAULT_SMALL_SERVER_ARGS])
    try:
        info = requests.get(f"{srv.base_url}/server_info", timeout=30).json()
        assert info["quantization"] == "gguf"
        assert weights_term_bytes(info) < 112 * MIB  # the packed embedding / lm_head table
        for prompt, expected in zip(PROMPTS, engine_texts):
            r = requests.post(f"{srv.base_url}/generate", json={"text": prompt, "sampling_params": SAMPLING}, timeout=120)
            assert r.status_code == 200, r.text
            assert r.json()["text"] == expected
        chat = openai_client(srv.base_url).chat.completions.create(
            model="default", messages=[{"role": "user", "content": "Name three colors."}], temperature=0, max_tokens=16)
        assert chat.choices[0].message.content.strip() and chat.usage.completion_tokens > 0
    finally:
        srv.kill()


@needs_kernels
def test_greedy_decode_takes_the_fused_lm_head_argmax(engine, monkeypatch):
    """A greedy decode batch gets its tokens from the packed lm_head's fused argmax (quant_linear_argmax.h: the
    logits are never written), and they are the tokens the sampler picks from the logits: a batch of the 3 prompts
    (and a 4th asking for logprobs, so its batches take the logits) gives the same text as with the fused path off.
    The fused path is counted: it ran for the steps (prefill and decode) of the greedy-only batches and never for the
    batch with the logprob request."""
    from sglang.srt.layers.vocab_embedding import ParallelLMHead

    fused_rows = []
    real = ParallelLMHead.greedy_tokens

    def counting(self, hidden):
        out = real(self, hidden)
        if out is not None:
            fused_rows.append(hidden.shape[0])
        return out

    monkeypatch.setattr(ParallelLMHead, "greedy_tokens", counting)
    fused = [o["text"] for o in engine.generate(PROMPTS, dict(SAMPLING))]
    assert len(fused_rows) >= SAMPLING["max_new_tokens"] - 2 and max(fused_rows) == len(PROMPTS), fused_rows
    fused_rows.clear()
    with_lp = engine.generate(PROMPTS[0], dict(SAMPLING), return_logprob=True)
    assert fused_rows == [] and with_lp["text"] == fused[0]
    monkeypatch.setattr(ParallelLMHead, "greedy_tokens", lambda self, hidden: None)  # the sampler's argmax instead
    assert [o["text"] for o in engine.generate(PROMPTS, dict(SAMPLING))] == fused
    assert_idle_and_intact(engine)


def test_flag_rules():
    assert resolve_quantization(None, True, "cpu", explicit_float32=False) == "gguf"
    assert resolve_quantization(None, True, "cpu", explicit_float32=True) == "none"  # the exact HF reference path
    assert resolve_quantization(None, False, "cpu", explicit_float32=False) == "none"
    assert resolve_quantization(None, True, "cuda", explicit_float32=False) == "none"
    assert resolve_quantization(None, True, "cpu", explicit_float32=False, kernels=False) == "none"  # no per-call dequant
    assert resolve_quantization("gguf", True, "cpu", explicit_float32=False, kernels=False) == "gguf"
    assert resolve_quantization("gguf", True, "cpu", explicit_float32=True) == "gguf"  # explicit wins
    assert resolve_quantization("w8a8_int8", False, "cpu", explicit_float32=False) == "w8a8_int8"
    with pytest.raises(ValueError, match="needs a .gguf --model-path"):
        resolve_quantization("gguf", False, "cpu", explicit_float32=False)
    with pytest.raises(ValueError, match="sized by `sglang plan` only"):
        resolve_quantization("fp8", False, "cpu", explicit_float32=False)
    with pytest.raises(ValueError, match="--tp-size 2"):
        resolve_quantization("w8a8_int8", False, "cpu", explicit_float32=False, tp_size=2)

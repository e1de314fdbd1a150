"""The lm_head of a GGUF file served from its own blocks (--quantization gguf; layers/quantization/vocab_method.py).

Against references computed here from the `gguf` package's own quantize / dequantize (independent of the packing):
    - the embedding lookup of a packed table (the tied embedding / lm_head) returns exactly the dequantized rows, for
      Q4_0 / Q4_1 / Q8_0, rows across 16-row records, the last row, repeats, row tails; the kernel's rows
      (quant_embedding.h) are the torch form's (dequantize_rows) bit for bit, bf16 and fp32, and it refuses ids out
      of range and tables of other formats;
    - logits from the packed table are the dequantized table's product within the kernel's activation-quantization
      error (test_quant_kernels.py's bounds: 3e-2 of the largest logit for 4-bit weights, 5e-3 for 8-bit); an 8-bit
      table on the one-pass path (quant_head_one_pass: AVX-512 without AMX) within each logit's own bound, every
      activation within half an int8 step of its block's scale, at every batch size the same bits; without the
      kernels the torch path gives the dense product;
    - which table a file packs (mem_plan/quantization_sizes.gguf_packed_vocab): an untied output.weight of a block
      type, the token_embd.weight where tied; F16 / F32 tables stay dense, and so does everything without 'gguf';
    - an untied Q8_0 output.weight on a GGUF MoE file through sglang.Engine: packed (the embedding stays dense),
      teacher-forced top-1 agreement with the same file read dense (bf16 lm_head) >= 95% (test_moe_gguf_quant.py's
      measure), `sglang plan`'s weights formula == the bytes of every tensor the served model holds.
The default model (tied, Q8_0 table) end to end: test_quant_serving.py.
"""

import contextlib
import io
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from sglang import Engine
from sglang.cli.plan import main as plan_main
from sglang.jit_kernel.cpu_ops import cpu_kernels_disabled
from sglang.srt.layers.quantization import packing, quantization_config
from sglang.srt.layers.quantization.linear_method import quant_kernels
from sglang.srt.layers.quantization.vocab_method import dequantize_rows
from sglang.srt.layers.vocab_embedding import ParallelLMHead, VocabParallelEmbedding
from sglang.srt.mem_plan.build import cpu_load_residual_bytes
from sglang.srt.mem_plan.model_shapes import CPU_LOAD_RESIDUAL_BYTES, CPU_PACKED_LOAD_RESIDUAL_BYTES
from sglang.srt.mem_plan.quantization_sizes import cpu_packed_bytes, gguf_packed_vocab, weight_format
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.tensor_bytes import tensor_bytes
from sglang.test.engine_fixtures import shutdown
from sglang.test.moe_fixtures import VOCAB_SIZE, make_random_qwen3_moe
from sglang.test.moe_gguf_fixtures import write_moe_gguf
from sglang.test.quant_fixtures import ONE_PASS_PATH, one_pass_bound
from sglang.test.top1_agreement import greedy_runs, teacher_forced_agreement

register_cpu_ci(est_time=15, suite="cpu")

GGUF_TYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 8}
BOUND = {4: 3e-2, 8: 5e-3}  # |kernel - exact| / max|exact|, test_quant_kernels.py
PROMPTS = [[(37 * i + 11 * j + 5) % VOCAB_SIZE for j in range(6 + i % 5)] for i in range(16)]
NEW_TOKENS = 24


def gguf_table(kind: str, rows: int, cols: int, seed: int = 0):
    """(packed table, its bits, fp32 reference [rows, cols]) of a random table quantized by the gguf package."""
    import gguf.quants as gq

    w = (np.random.default_rng(seed).standard_normal((rows, cols)) * 0.05).astype(np.float32)
    raw = gq.quantize(w, GGUF_TYPES[kind])
    ref = torch.from_numpy(gq.dequantize(raw, GGUF_TYPES[kind]).reshape(rows, cols).astype(np.float32))
    staging = packing.staging_from_gguf(torch.from_numpy(raw), GGUF_TYPES[kind])
    bits = packing.staging_bits(staging)
    return packing.pack(staging, bits), bits, ref, staging


@pytest.mark.parametrize("kind", list(GGUF_TYPES))
def test_embedding_rows_are_the_dequantized_rows(kind):
    rows, cols = 37, 96  # 3 records, the last one 5 rows
    packed, bits, ref, staging = gguf_table(kind, rows, cols)
    assert bits == (8 if kind == "Q8_0" else 4)
    ids = torch.tensor([0, 1, 15, 16, 17, 31, 32, 36, 36, 5, 0])
    for dtype in (torch.float32, torch.bfloat16):
        got = dequantize_rows(packed, bits, ids, cols, dtype)
        assert got.dtype == dtype and torch.equal(got, ref[ids].to(dtype)), (kind, dtype)
    # through the layer: a packed embedding built by quantization_config, loaded from the staging form
    with quantization_config("gguf", "embedding"):
        emb = VocabParallelEmbedding(rows, cols)
        head = ParallelLMHead(rows, cols).tie_weights(emb)
    emb.weight.weight_loader(emb.weight, staging)
    assert emb.weight is None and emb.qweight.numel() == cpu_packed_bytes(rows, cols, bits)
    assert head.weight is None and not list(head.parameters()) and not list(head.buffers())  # one table
    assert torch.equal(emb(ids), ref[ids])  # float32: the default dtype the layer was built in
    many = torch.randint(0, rows, (1000,), generator=torch.Generator().manual_seed(0))  # several passes
    assert torch.equal(emb(many), ref[many])
    with cpu_kernels_disabled():  # the torch form where the kernels do not run
        assert torch.equal(emb(many), ref[many])


@pytest.mark.parametrize("kind", list(GGUF_TYPES))
def test_embedding_kernel_is_dequantize_rows(kind):
    ops = quant_kernels()
    if ops is None:
        pytest.skip("no kernels here: the lookup is dequantize_rows itself")
    rows, cols = 37, 96
    packed, bits, _, _ = gguf_table(kind, rows, cols, seed=4)
    gen = torch.Generator().manual_seed(5)
    cases = [torch.tensor([15, 16, 36, 0, 31, 32, 36, 36, 15]),  # record edges, the last row, repeats
             torch.tensor([], dtype=torch.int64),
             torch.randint(0, rows, (700,), generator=gen),  # chunks on several threads
             torch.tensor([16, 36, 1], dtype=torch.int32)]
    for ids in cases:
        for n_cols in (cols, cols - 13):  # and a row tail short of its last block
            for dtype, bits_view in ((torch.bfloat16, torch.int16), (torch.float32, torch.int32)):
                got = ops.quant_embedding(ids, packed, rows, n_cols, bits, out_fp32=dtype == torch.float32)
                want = dequantize_rows(packed, bits, ids, n_cols, dtype)
                assert got.dtype == dtype and got.shape == (len(ids), n_cols)
                assert torch.equal(got.view(bits_view), want.view(bits_view)), (kind, len(ids), n_cols, dtype)
    for bad in (37, -1):
        with pytest.raises(RuntimeError, match=f"id {bad} \\(at 1\\) out of range \\[0, 37\\)"):
            ops.quant_embedding(torch.tensor([3, bad, 5]), packed, rows, cols, bits)
    with pytest.raises(RuntimeError, match="got format 20"):  # 4-bit, fp32 header: a K-quant's
        ops.quant_embedding(torch.tensor([3]), packed, rows, cols, 20)


@pytest.mark.parametrize("kind", list(GGUF_TYPES))
def test_logits_within_the_kernels_error(kind):
    rows, cols = 1100, 576  # more than TORCH_PATH_ROWS: the torch path runs in slices, the last one 76 rows
    _, bits, ref, staging = gguf_table(kind, rows, cols, seed=1)
    with quantization_config("gguf", "lm_head"):
        head = ParallelLMHead(rows, cols)
    head.weight.weight_loader(head.weight, staging)
    x = torch.randn(33, cols, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    exact = x.double() @ ref.double().t()
    with cpu_kernels_disabled():  # the torch path: the dequantized table's product, in fp32 (logits are fp32)
        torch.testing.assert_close(head.logits(x.float()), F.linear(x.float(), ref), rtol=1e-5, atol=1e-5)
        torch_path = head.logits(x)
        assert head.greedy_tokens(x) is None  # no fused argmax without the kernels: the sampler takes the logits
    assert torch_path.dtype == torch.float32
    torch.testing.assert_close(torch_path, F.linear(x.float(), ref), rtol=1e-5, atol=1e-5)
    if quant_kernels() is None:
        pytest.skip("no quant_linear here: the torch path serves the lm_head")
    got = head.logits(x)
    # fp32: the kernel's sums, not rounded to the activations' bf16 (rounding them would add up to 2^-9 of a logit)
    assert got.shape == (33, rows) and got.dtype == torch.float32
    one_pass = bits == 8 and quant_kernels().quant_path(33, head=True) == ONE_PASS_PATH
    if one_pass:  # each logit within its own bound: one int8 pass of activations, the weights exact
        ratio = ((got.double() - exact).abs() / one_pass_bound(x, ref)).max().item()
        print(f"{kind}: one-pass error at most {ratio:.3f} of its bound")
        assert ratio <= 1.0, (kind, ratio)
        assert torch.equal(head.logits(x[:1]), got[:1])  # one path at every row count
    else:
        err = (got.double() - exact).abs().max().item() / exact.abs().max().item()
        assert err < BOUND[bits], (kind, err)
    # a row's logits do not depend on its batch mates, within a kernel path (33 bf16 rows take the dense one where
    # there is one, from 32 rows; fewer take the int8 ones)
    assert torch.equal(head.logits(x[:32]), got[:32])
    assert torch.equal(head.logits(x[:1]), head.logits(x[:31])[:1])
    assert not torch.equal(got, got.bfloat16().float())  # not bf16 values widened


@pytest.mark.parametrize("kind", list(GGUF_TYPES))
def test_greedy_tokens_are_the_argmax_of_the_logits(kind):
    """The fused lm_head argmax (quant_linear_argmax.h) == torch's argmax of head.logits for every row, at the row
    counts of each kernel path (VNNI below 8 rows, AMX int8 tiles, the dense bf16 path from 32 rows on an AMX CPU),
    a vocabulary of 1,100 rows (17 slices of 64 and a partial tile), and rows whose maximum sits in a late slice,
    repeats in two slices (the first wins), or is a NaN (the first NaN wins, as torch.argmax's rule)."""
    if quant_kernels() is None:
        pytest.skip("no quant_linear here: the sampler takes the torch path's logits")
    rows, cols = 1100, 576
    _, _, ref, staging = gguf_table(kind, rows, cols, seed=2)
    with quantization_config("gguf", "lm_head"):
        head = ParallelLMHead(rows, cols)
    head.weight.weight_loader(head.weight, staging)
    gen = torch.Generator().manual_seed(3)
    for m in (1, 7, 8, 31, 32, 33, 300):
        x = torch.randn(m, cols, generator=gen).to(torch.bfloat16)
        logits = head.logits(x)
        got = head.greedy_tokens(x)
        assert got.dtype == torch.int64 and got.shape == (m,)
        assert torch.equal(got, logits.max(dim=-1).indices), m  # max().indices: torch's first-maximum rule
    # a row whose best logit is in the last slice: x aligned with table row 1090 (past 17 x 64 tiles x 16 = 1088)
    x = ref[1090:1091].to(torch.bfloat16) * 8
    assert head.greedy_tokens(x).item() == head.logits(x).max(dim=-1).indices.item()
    # ties across slices: a table whose rows 5 and 1095 are equal, x aligned with them -> 5
    tied = ref.clone()
    tied[1095] = tied[5]
    _, _, _, staging2 = gguf_table(kind, rows, cols, seed=2)
    with quantization_config("gguf", "lm_head"):
        head2 = ParallelLMHead(rows, cols)
    staging2[1095] = staging2[5]
    head2.weight.weight_loader(head2.weight, staging2)
    x = tied[5:6].to(torch.bfloat16) * 8
    logits = head2.logits(x)
    assert logits[0, 5] == logits[0, 1095] == logits.max()
    assert head2.greedy_tokens(x).item() == 5
    # NaN activations: every logit of the row is NaN -> index 0, as torch's argmax
    x = torch.randn(2, cols, generator=gen).to(torch.bfloat16)
    x[1, 3] = float("nan")
    assert head.greedy_tokens(x).tolist() == head.logits(x).max(dim=-1).indices.tolist()


def test_which_table_is_packed_and_when(tmp_path):
    hf = make_random_qwen3_moe(str(tmp_path / "hf"), num_experts=4, moe_intermediate_size=64, hidden_size=64)
    tied = make_random_qwen3_moe(str(tmp_path / "tied"), num_experts=4, moe_intermediate_size=64, hidden_size=64,
                                 tie_word_embeddings=True)
    cases = [(hf, {"output": "Q8_0"}, ("lm_head", 8)), (hf, {"output": "Q4_1", "token_embd": "Q4_0"}, ("lm_head", 4)),
             (hf, {}, ("", 0)), (hf, {"output": "F16"}, ("", 0)),  # a wide table stays dense, not requantized
             (tied, {"token_embd": "Q4_0"}, ("embedding", 4)), (tied, {}, ("", 0))]
    for i, (src, types, want) in enumerate(cases):
        path = write_moe_gguf(src, str(tmp_path / f"{i}.gguf"), "Q4_0", types)
        assert gguf_packed_vocab(path) == want, (types, want)
    for table in (("embedding", 4), ("lm_head", 8)):  # a packed lm_head table: the load leaves less behind
        assert cpu_load_residual_bytes(weight_format("gguf", None, "Q4_0", packed_vocab=table)) == \
            CPU_PACKED_LOAD_RESIDUAL_BYTES < CPU_LOAD_RESIDUAL_BYTES
    assert cpu_load_residual_bytes(weight_format("gguf", None, "Q4_0")) == CPU_LOAD_RESIDUAL_BYTES
    with pytest.raises(ValueError, match="GGUF file's blocks"):  # w8a8_int8 (any checkpoint) keeps the tables dense
        with quantization_config("w8a8_int8", "lm_head"):
            pass
    with quantization_config("gguf"):  # no table named: both dense, the lm_head shares the embedding's weight
        emb = VocabParallelEmbedding(64, 64)
        head = ParallelLMHead(64, 64).tie_weights(emb)
    assert emb.quant_method is None and head.weight is emb.weight



def test_untied_q8_0_output_of_a_moe_file(tmp_path):
    hf = make_random_qwen3_moe(str(tmp_path / "hf"), num_experts=16, moe_intermediate_size=64, hidden_size=128,
                               num_experts_per_tok=4, embed_std=1.0)
    path = write_moe_gguf(hf, str(tmp_path / "moe.gguf"), "Q4_0", {"output": "Q8_0"})
    flags = dict(dtype="bfloat16", skip_tokenizer_init=True, max_total_tokens=1024, chunked_prefill_size=64,
                 log_level="warning", random_seed=0, model_cache_dir=str(tmp_path / "cache"))
    dense = Engine(model_path=path, quantization="none", **flags)
    try:
        runner = dense.scheduler.model_runner
        assert runner.model.lm_head.quant_method is None
        runs = greedy_runs(runner.model, runner.model_config, PROMPTS, NEW_TOKENS)
    finally:
        shutdown(dense)
    engine = Engine(model_path=path, quantization="gguf", **flags)
    try:
        runner = engine.scheduler.model_runner
        model = runner.model
        head, emb = model.lm_head, model.model.embed_tokens
        assert head.quant_bits == 8 and head.weight is None and emb.quant_method is None
        assert emb.weight.dtype == torch.bfloat16
        rate = teacher_forced_agreement(model, runner.model_config, PROMPTS, runs)
        print(f"Q8_0 lm_head (Q4_0 layers) vs the file read dense: top-1 agreement {rate:.3f} "
              f"({len(PROMPTS) * NEW_TOKENS} positions)")
        assert rate >= 0.95
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            status = plan_main(["--device", "cpu", "--model-path", path, "--quantization", "gguf", "--dtype",
                                "bfloat16", "--chunked-prefill-size", "64", "--max-total-tokens", "1024",
                                "--model-cache-dir", str(tmp_path / "cache"), "--json"])
        assert status == 0, buf.getvalue()
        weights = next(t["num_bytes"] for t in json.loads(buf.getvalue())["plan"]["terms"] if t["name"] == "weights")
        assert weights - CPU_PACKED_LOAD_RESIDUAL_BYTES == tensor_bytes(model), (weights, tensor_bytes(model))
        assert head.qweight.numel() == cpu_packed_bytes(VOCAB_SIZE, 128, 8)
    finally:
        shutdown(engine)

"""The Triton MLA kernels (triton_ops/mla_decode.py, mla_extend.py) against the EXPANDED multi-head form in float64.

Shared by test_triton_mla_interpreted.py, which runs this file as a child process with TRITON_INTERPRET=1 (triton
fixes its interpreter mode at import; interpreted_run.py says why) and reads its one RESULT_JSON line: the kernels'
errors and the Triton backend's over the MLA pool (mla_backend_steps.py). Not a test file itself (run_suite
collects test_*.py only).

The reference never sees a latent: per head h, K_h = c_kv @ W_UK[h]^T ++ k_pe and V_h = c_kv @ W_UV[h]^T (random
W_UK [H, nope, lora] and W_UV [H, v_head, lora]), softmax(q_h . K_h * scale) V_h in float64, causal. The kernels get
the absorbed query [q_nope @ W_UK[h] | q_pe], the pool's latent rows [c_kv | k_pe] behind shuffled pages, and their
latent output goes through W_UV[h] afterwards, as the model does.
"""

import json
import os
import sys

import torch
from triton_attention_cases import PagedKV

RESULT_PREFIX = "RESULT_JSON:"
# max abs error of the final per-head output (|out| ~ 1) against the float64 expanded form
TOL = {torch.float32: 1e-5, torch.float16: 2e-3}


def worst(err: float, diff: torch.Tensor) -> float:
    """The larger of err and max |diff|, a NaN anywhere (an output never written) counting as inf: Python's max()
    would keep err over a NaN."""
    d = float(diff.abs().max()) if diff.numel() else 0.0
    return float("inf") if d != d else max(err, d)


class MLAWeights:
    """One layer's W_UK [H, nope, lora], W_UV [H, v_head, lora] (float64) and the two ways to attend with them."""

    def __init__(self, num_heads, lora, rope, nope, v_head, gen):
        self.num_heads, self.lora, self.rope = num_heads, lora, rope
        self.w_uk = torch.randn(num_heads, nope, lora, generator=gen, dtype=torch.float64) / lora**0.5
        self.w_uv = torch.randn(num_heads, v_head, lora, generator=gen, dtype=torch.float64) / lora**0.5
        self.scale = (nope + rope) ** -0.5
        self.gen = gen

    def queries(self, n, dtype):
        """(q_nope [n, H, nope], q_pe [n, H, rope]) float64 and the absorbed kernel query [n, H, lora + rope]."""
        q_nope = torch.randn(n, self.num_heads, self.w_uk.shape[1], generator=self.gen, dtype=torch.float64)
        q_pe = torch.randn(n, self.num_heads, self.rope, generator=self.gen, dtype=torch.float64)
        absorbed = torch.cat([torch.einsum("nhp,hpc->nhc", q_nope, self.w_uk), q_pe], -1)
        return q_nope, q_pe, absorbed.to(dtype)

    def expanded(self, q_nope, q_pe, rows, q_positions):
        """The expanded form: K/V per head from the latent rows [T, lora + rope], float64, causal -> [n, H, v_head]."""
        rows = rows.double()
        c, pe = rows[:, : self.lora], rows[:, self.lora :]
        k_nope = torch.einsum("tc,hpc->thp", c, self.w_uk)  # [T, H, nope]
        v = torch.einsum("tc,hvc->thv", c, self.w_uv)  # [T, H, v_head]
        scores = (torch.einsum("nhp,thp->hnt", q_nope, k_nope) + torch.einsum("nhr,tr->hnt", q_pe, pe)) * self.scale
        future = torch.arange(rows.shape[0])[None, :] > torch.as_tensor(q_positions)[:, None]
        scores = scores.masked_fill(future[None], float("-inf"))
        return torch.einsum("hnt,thv->nhv", scores.softmax(-1), v)

    def up(self, o_latent):
        """A kernel's latent output [n, H, lora] (or [n, H * lora]) through W_UV -> [n, H, v_head] (float64)."""
        o = o_latent.double().reshape(o_latent.shape[0], self.num_heads, self.lora)
        return torch.einsum("nhc,hvc->nhv", o, self.w_uv)


class LatentProblem(MLAWeights):
    """MLA weights and a one-layer paged latent pool with shuffled pages holding every request's rows
    (triton_attention_cases.PagedKV)."""

    def __init__(self, seq_lens, num_heads, lora, rope, nope, v_head, page_size, dtype, seed=0):
        g = torch.Generator().manual_seed(seed)
        super().__init__(num_heads, lora, rope, nope, v_head, g)
        self.dtype = dtype
        # the latent rows are a one-head K pool of width lora + rope (its V pool, one column wide, goes unused); the
        # rows are in the KV dtype and the reference reads the same rounded values
        kv = PagedKV(seq_lens, 1, lora + rope, 1, page_size, dtype, max_ctx=max(seq_lens) + 2 * page_size, seed=seed)
        self.rows, self.req_to_token, self.table_rows = kv.k_pool, kv.req_to_token, kv.rows

    def seq_rows(self, b, n):
        return self.rows[self.req_to_token[self.table_rows[b], :n], 0]  # [n, lora + rope]

    def queries(self, n):
        return super().queries(n, self.dtype)


def run_decode(seq_lens, num_heads, lora, rope, nope, v_head, page_size, dtype, num_splits, tiles=None,
               heads_per_program=None, scale_error=1.0, device="cpu"):
    """Max abs error of mla_decode_fwd (absorbed) against the expanded form (scale_error != 1 runs the kernel with a
    wrong softmax scale, to show the comparison can fail)."""
    from sglang.srt.layers.attention.triton_ops import mla_decode_fwd

    p = LatentProblem(seq_lens, num_heads, lora, rope, nope, v_head, page_size, dtype)
    bs = len(seq_lens)
    q_nope, q_pe, q = p.queries(bs)
    slots_r = bs + 2  # the workspace is sized for the planned slots
    d = dict(device=device)
    partial = torch.full((slots_r, num_heads, num_splits, lora), float("nan"), **d)
    lse = torch.full((slots_r, num_heads, num_splits), float("nan"), **d)
    o = torch.full((bs, num_heads, lora), float("nan"), dtype=dtype, **d)
    mla_decode_fwd(q.to(device), p.rows.to(device), o, p.req_to_token.to(device), p.table_rows.to(device),
                   torch.tensor(seq_lens, **d), partial, lse, p.scale * scale_error, tiles=tiles,
                   max_seq_len=max(seq_lens), heads_per_program=heads_per_program)
    out = p.up(o.cpu())
    err = 0.0
    for b, n in enumerate(seq_lens):
        ref = p.expanded(q_nope[b : b + 1], q_pe[b : b + 1], p.seq_rows(b, n), [n - 1])
        err = worst(err, out[b : b + 1] - ref)
    return err


def run_extend(prefix_lens, extend_lens, num_heads, lora, rope, nope, v_head, page_size, dtype, tiles=None,
               heads_per_program=None, rows_per_program=None, scale_error=1.0, device="cpu"):
    """Max abs error of mla_extend_fwd (absorbed, a cached prefix read from the pool) against the expanded form."""
    from sglang.srt.layers.attention.triton_ops import mla_extend_fwd

    seq_lens = [a + e for a, e in zip(prefix_lens, extend_lens)]
    p = LatentProblem(seq_lens, num_heads, lora, rope, nope, v_head, page_size, dtype, seed=1)
    total = sum(extend_lens)
    q_nope, q_pe, q = p.queries(total)
    # the new tokens' rows are what the pool holds at their slots (the backend writes them before attending)
    k_new = torch.cat([p.rows[p.req_to_token[p.table_rows[b], a:s]] for b, (a, s) in
                       enumerate(zip(prefix_lens, seq_lens))])
    d = dict(device=device)
    o = torch.full((total, num_heads, lora), float("nan"), dtype=dtype, **d)
    qo_start = torch.tensor([0] + extend_lens[:-1]).cumsum(0)
    mla_extend_fwd(q.to(device), k_new.to(device), o, p.rows.to(device), p.req_to_token.to(device),
                   p.table_rows.to(device), qo_start.to(device), torch.tensor(extend_lens, **d),
                   torch.tensor(prefix_lens, **d), max(extend_lens), p.scale * scale_error, tiles=tiles,
                   heads_per_program=heads_per_program, rows_per_program=rows_per_program)
    out = p.up(o.cpu())
    err, start = 0.0, 0
    for b, (a, e) in enumerate(zip(prefix_lens, extend_lens)):
        ref = p.expanded(q_nope[start : start + e], q_pe[start : start + e], p.seq_rows(b, a + e),
                         list(range(a, a + e)))
        err = worst(err, out[start : start + e] - ref)
        start += e
    return err


# mixed lengths (1 token, several splits and key blocks with the GPU tiles, the longest past one interpreter block);
# 20 heads with 16 per program: a second, partly masked head block; lora 96 (not a power of two: masked padding)
DECODE_CASES = [
    dict(seq_lens=[1, 37, 300, 70], num_heads=20, lora=64, rope=32, nope=48, v_head=40, num_splits=4,
         heads_per_program=16),
    dict(seq_lens=[130, 9], num_heads=8, lora=96, rope=16, nope=32, v_head=24, num_splits=8),
]
# no prefix, a prefix ending mid-page, a one-token extend after a prefix, an extend spanning query blocks; the
# second case as on a GPU (16 heads and 32 rows per program: two tokens x 16 heads, a second, partly masked head block)
EXTEND_CASES = [
    dict(prefix_lens=[0, 21, 40], extend_lens=[6, 35, 1], num_heads=8, lora=64, rope=32, nope=48, v_head=40),
    dict(prefix_lens=[0, 300], extend_lens=[19, 4], num_heads=20, lora=96, rope=16, nope=32, v_head=24,
         heads_per_program=16, rows_per_program=32),
]


# DeepSeek V2/V3's widths (kv_lora 512, rope 64, nope 128, v_head 128) at 128 heads (tp 1) and 16 (tp 8): compiled on a
# GPU only (test_triton_mla_gpu.py), with the kernels' default heads and rows per program
DEEPSEEK_DECODE_CASES = [
    dict(seq_lens=[1, 100, 700], num_heads=128, lora=512, rope=64, nope=128, v_head=128, num_splits=8),
    dict(seq_lens=[33, 1000], num_heads=16, lora=512, rope=64, nope=128, v_head=128, num_splits=4),
]
DEEPSEEK_EXTEND_CASES = [
    dict(prefix_lens=[0, 300], extend_lens=[50, 70], num_heads=128, lora=512, rope=64, nope=128, v_head=128),
    dict(prefix_lens=[17, 0], extend_lens=[1, 200], num_heads=16, lora=512, rope=64, nope=128, v_head=128),
]


def kernel_errors() -> dict:
    """{'kind|tiles|dtype|page_size|case': max abs error} plus 'broken|...' runs that must be far off."""
    from sglang.srt.layers.attention.triton_ops.interpreter_blas import use_single_threaded_blas
    from sglang.srt.layers.attention.triton_ops.jit_mode import interpreted
    from sglang.srt.layers.attention.triton_ops.tiles import GPU_TILES, INTERPRETER_TILES

    assert interpreted(), "run with TRITON_INTERPRET=1"
    use_single_threaded_blas()
    errors = {}
    for tiles_name, tiles in (("gpu", GPU_TILES), ("interpreter", INTERPRETER_TILES)):
        for dtype in TOL:
            for page_size in (1, 16):
                for i, c in enumerate(DECODE_CASES):
                    errors[f"decode|{tiles_name}|{dtype}|{page_size}|{i}"] = run_decode(
                        page_size=page_size, dtype=dtype, tiles=tiles, **c)
                for i, c in enumerate(EXTEND_CASES):
                    errors[f"extend|{tiles_name}|{dtype}|{page_size}|{i}"] = run_extend(
                        page_size=page_size, dtype=dtype, tiles=tiles, **c)
    f32 = dict(page_size=16, dtype=torch.float32)
    errors["broken|decode_scale"] = run_decode(scale_error=1.5, **f32, **DECODE_CASES[0])
    errors["broken|extend_scale"] = run_extend(scale_error=1.5, **f32, **EXTEND_CASES[0])
    return errors


def backend_errors() -> dict:
    """TritonAttnBackend over the MLA pool (mla_backend_steps.MLA_STEPS): {'dtype|page_size': [error per step]}, and
    the decode steps through its CUDA-graph hook ('graph'), with which of its workspaces those wrote."""
    from mla_backend_steps import mla_harness, run_mla_steps

    runs = [(torch.float32, 1), (torch.float32, 16), (torch.float16, 16)]
    errors = {f"{dtype}|{page_size}": run_mla_steps(mla_harness("triton", page_size=page_size, dtype=dtype))
              for dtype, page_size in runs}
    # the planned cuda_graph_attn_* workspace and every split launched
    h = mla_harness("triton", page_size=16, graph_bs=4)
    for name in ("attn_lse", "cuda_graph_attn_lse"):
        h.backend.buffers[name].fill_(float("nan"))
    errors["graph"] = run_mla_steps(h, graph_decode=True)
    errors["graph_workspace_written"] = bool(h.backend.buffers["cuda_graph_attn_lse"].isfinite().any())
    errors["eager_workspace_written"] = bool(h.backend.buffers["attn_lse"].isfinite().any())
    return errors


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    result = {"kernels": kernel_errors(), "backend": backend_errors()}
    print(RESULT_PREFIX + json.dumps(result), flush=True)

"""Shared by the Triton kernel tests (CPU interpreter and GPU): a plain float64 torch attention reference, a paged
one-layer KV pool with shuffled pages, and runners that return the max abs error of a kernel against the reference.
Not a test file itself (run_suite collects test_*.py only)."""

import torch

# max abs error against the float64 reference (bf16: GPU only, the interpreter's bf16 dot is wrong)
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def reference(q, k_seq, v_seq, q_positions, scale):
    """q [Lq, H, D] at sequence positions q_positions; k_seq/v_seq [L, KV, D/Dv] the whole sequence -> [Lq, H, Dv].
    float64, causal (query at position p sees keys 0..p)."""
    group = q.shape[1] // k_seq.shape[1]
    k = k_seq.double().repeat_interleave(group, dim=1)
    v = v_seq.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    future = torch.arange(k.shape[0])[None, :] > torch.as_tensor(q_positions)[:, None]
    scores = scores.masked_fill(future, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


class PagedKV:
    """A one-layer K/V pool with page_size-aligned, shuffled pages and a req_to_token table (row 0 = dummy)."""

    def __init__(self, seq_lens, num_kv_heads, head_dim, v_dim, page_size, dtype, max_ctx=256, seed=0):
        g = torch.Generator().manual_seed(seed)
        pages_per_req = [-(-n // page_size) for n in seq_lens]
        num_pages = sum(pages_per_req) + 3
        order = torch.randperm(num_pages, generator=g) + 1  # page 0 is the dummy page
        rows = (num_pages + 1) * page_size
        self.k_pool = torch.randn(rows, num_kv_heads, head_dim, generator=g).to(dtype)
        self.v_pool = torch.randn(rows, num_kv_heads, v_dim, generator=g).to(dtype)
        self.req_to_token = torch.zeros(len(seq_lens) + 4, max_ctx, dtype=torch.int64)
        # requests use table rows in reverse order, so row != batch index
        self.rows = torch.arange(len(seq_lens), 0, -1, dtype=torch.int64) + 1
        used = 0
        for b, n in enumerate(seq_lens):
            pages = order[used : used + pages_per_req[b]]
            used += pages_per_req[b]
            slots = (pages[:, None] * page_size + torch.arange(page_size)[None, :]).reshape(-1)[:n]
            self.req_to_token[self.rows[b], :n] = slots

    def seq_kv(self, b, n):
        slots = self.req_to_token[self.rows[b], :n]
        return self.k_pool[slots], self.v_pool[slots]


# mixed lengths (1 token, fewer tokens than splits, several KV blocks per split), GQA 4:1 and 3:1 and MHA, a head dim
# that is not a power of two, the split count capped by --triton-attention-num-kv-splits
DECODE_CASES = [
    dict(seq_lens=[1, 5, 70, 33], num_q_heads=8, num_kv_heads=2, head_dim=32, num_splits=4),
    dict(seq_lens=[150, 3], num_q_heads=4, num_kv_heads=4, head_dim=24, num_splits=8),
    dict(seq_lens=[17, 64], num_q_heads=6, num_kv_heads=2, head_dim=32, num_splits=1),
    dict(seq_lens=[200, 31, 2], num_q_heads=6, num_kv_heads=2, head_dim=32, num_splits=4),
]
# no prefix, a cached prefix that ends mid-page, a one-token extend after a prefix, extends longer than one query
# block (several query blocks and causal key blocks with the GPU tiles)
EXTEND_CASES = [
    dict(prefix_lens=[0, 20, 37], extend_lens=[5, 45, 1], num_q_heads=8, num_kv_heads=2, head_dim=32),
    dict(prefix_lens=[16, 0], extend_lens=[7, 33], num_q_heads=3, num_kv_heads=3, head_dim=24),
    dict(prefix_lens=[3, 50], extend_lens=[30, 2], num_q_heads=6, num_kv_heads=2, head_dim=32),
]


def run_decode(seq_lens, num_q_heads, num_kv_heads, head_dim, page_size, num_splits, dtype, v_dim=None, tiles=None,
               device="cpu", scale_error=1.0):
    """Max abs error of decode_attention_fwd against the reference (scale_error != 1 runs the kernel with a wrong
    softmax scale, to show the comparison can fail)."""
    from sglang.srt.layers.attention.triton_ops import decode_attention_fwd

    v_dim = v_dim or head_dim
    kv = PagedKV(seq_lens, num_kv_heads, head_dim, v_dim, page_size, dtype)
    bs, scale = len(seq_lens), head_dim**-0.5
    q = torch.randn(bs, num_q_heads, head_dim, generator=torch.Generator().manual_seed(1)).to(dtype)
    slots_r = bs + 2  # the workspace is sized for the planned slots, larger than the batch
    d = dict(device=device)
    o = torch.empty(bs, num_q_heads, v_dim, dtype=dtype, **d)
    partial = torch.full((slots_r, num_q_heads, num_splits, v_dim), float("nan"), **d)
    lse = torch.full((slots_r, num_q_heads, num_splits), float("nan"), **d)
    decode_attention_fwd(q.to(device), kv.k_pool.to(device), kv.v_pool.to(device), o, kv.req_to_token.to(device),
                         kv.rows.to(device), torch.tensor(seq_lens, **d), partial, lse, scale * scale_error,
                         tiles=tiles)
    o = o.cpu()
    err = 0.0
    for b, n in enumerate(seq_lens):
        k_seq, v_seq = kv.seq_kv(b, n)
        ref = reference(q[b : b + 1], k_seq, v_seq, [n - 1], scale)[0]
        err = max(err, (o[b].double() - ref).abs().max().item())
    return err


def run_extend(prefix_lens, extend_lens, num_q_heads, num_kv_heads, head_dim, page_size, dtype, tiles=None,
               device="cpu", scale_error=1.0):
    """Max abs error of extend_attention_fwd against the reference (see run_decode)."""
    from sglang.srt.layers.attention.triton_ops import extend_attention_fwd

    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
    kv = PagedKV(seq_lens, num_kv_heads, head_dim, head_dim, page_size, dtype)
    g = torch.Generator().manual_seed(2)
    total, scale = sum(extend_lens), head_dim**-0.5
    q = torch.randn(total, num_q_heads, head_dim, generator=g).to(dtype)
    # the new tokens' K/V are what the pool holds at their slots (the backend writes them before attending)
    k_new = torch.cat([kv.seq_kv(b, s)[0][p:] for b, (p, s) in enumerate(zip(prefix_lens, seq_lens))])
    v_new = torch.cat([kv.seq_kv(b, s)[1][p:] for b, (p, s) in enumerate(zip(prefix_lens, seq_lens))])
    d = dict(device=device)
    o = torch.full((total, num_q_heads, head_dim), float("nan"), dtype=dtype, **d)
    qo_start = torch.tensor([0] + extend_lens[:-1]).cumsum(0)
    extend_attention_fwd(q.to(device), k_new.to(device), v_new.to(device), o, kv.k_pool.to(device),
                         kv.v_pool.to(device), kv.req_to_token.to(device), kv.rows.to(device), qo_start.to(device),
                         torch.tensor(extend_lens, **d), torch.tensor(prefix_lens, **d), max(extend_lens),
                         scale * scale_error, tiles=tiles)
    o = o.cpu()
    err, start = 0.0, 0
    for b, (p, e) in enumerate(zip(prefix_lens, extend_lens)):
        k_seq, v_seq = kv.seq_kv(b, p + e)
        ref = reference(q[start : start + e], k_seq, v_seq, list(range(p, p + e)), scale)
        err = max(err, (o[start : start + e].double() - ref).abs().max().item())
        start += e
    return err

"""TorchNativeAttnBackend: attention over the paged KV pool with torch's scaled_dot_product_attention.

Runs on CPU and GPU. Per forward, `init_forward_metadata` builds the extend masks once; each layer then writes its
new K/V to the pool and attends. Decode works on row groups of at most DECODE_GATHER_TOKENS padded tokens: per group
a padded slot table, one gather of K/V and one batched SDPA call (so its scratch is bounded whatever B x context);
extend runs one SDPA call per request.

Query layouts:
  decode   q [B, H, D] is viewed as [B, KV, G, D] (G = H / KV query heads per KV head); the G heads of a group
           act as G queries against that group's keys, so no KV expansion is needed.
  extend   one SDPA call per request, so nothing is padded to the longest request. A request without a cached
           prefix takes SDPA's is_causal path on its new K/V directly; one with a prefix gathers its K/V from the
           pool and attends with a [q_len, seq_len] mask (query i at position prefix_len + i sees keys j <= it).
           The transient of one such call is bounded by the "extend_attention" declaration (mem_plan/backends.py),
           which the memory plan reserves.

A quantized pool (fp8 with scales, int8, int4, int2_hadamard: mem_cache/quantized_kv_pool.py) is read through its
gather_kv: only the gathered rows of one request (extend) or one row group (decode) are dequantized, never the pool;
formats stored in a rotated basis are attended there (the query turned once, the output turned back once).

On a CPU, decode instead calls one fused kernel per layer that writes the new K/V and reads each request's keys and
values in place through req_to_token: no gathered copy, no padding, no mask. A bf16 pool from level avx512_bf16
(sgl-kernel/csrc/cpu/decode_attention.h), an fp32 pool from level avx2 (decode_attention_f32_impl.h). Extend there
writes the new K/V to the pool and calls extend_attention (extend_attention_op.h): every new token attends through
req_to_token as a decode step would, prefix or not, in one call per layer for the whole batch.

A quantized pool whose codes the CPU kernel reads (int8, int4, int2_hadamard, fp8_e4m3, fp8_e5m2: every format,
cpu_kernel_ops.QUANT_KERNEL_FORMATS, from level avx512_vnni, sgl-kernel/csrc/cpu/decode_attention_quant.h) takes
extend_attention_quant for decode and extend alike: the module quantizes the new rows on write (kv_quant_write, the
codec's rule), then every new token attends over the codes in place (a decode step is an extend of one token), the
query turned into the keys' stored basis and (int4, int2_hadamard) the output turned back out of the values', inside
the kernel; no row is dequantized outside its registers. As on the torch path, a prefill
batch without any cached prefix attends to its own fresh K/V instead (extend_attention over k/v themselves, a table
of their row numbers as req_to_token).

Over a quantized pool every path attends a forward's own new tokens as computed (the fresh k/v, in the basis the pool
stores them in) and only the tokens of earlier forwards through their codes: the kernel takes them as fresh_k /
fresh_v, the gather path puts them over their gathered rows. The codes are written all the same, for later forwards.
A token's own key and its chunk's keys are what its query weighs most (docs/kv_quantization.md: int4's decode top-1
vs bf16 91.9% -> 95.1%, perplexity +4.4% -> +0.6% on the quick set).

An MLA layer on a latent pool (mem_cache/mla_pool.py) is attended by torch_native_mla.py: MQA over the latent rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional

import torch
import torch.nn.functional as F

from sglang.srt.layers.attention.base_attn_backend import AttentionBackend, AttentionLayer
from sglang.srt.layers.attention.cpu_kernel_ops import fused_cpu_decode_ops, fused_cpu_quant_ops
from sglang.srt.layers.attention.quant_kernel_operands import QuantOperandCache
from sglang.srt.layers.attention.torch_native_mla import MLATorchAttention, is_mla_layer
from sglang.srt.layers.attention.torch_native_window import WindowedTorchAttention, needs_window_path
from sglang.srt.mem_cache.recent_window import WindowTail
from sglang.srt.mem_plan.backends import DECODE_GATHER_TOKENS
from sglang.srt.mem_plan.kv_quant import decode_gather_tokens, is_quantized

if TYPE_CHECKING:
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch


@dataclass
class ExtendRequest:
    q_start: int  # first row of this request's new tokens in q
    q_len: int
    kv_indices: Optional[torch.Tensor] = None  # [1, seq_len] KV slots, when the request has a cached prefix
    attn_mask: Optional[torch.Tensor] = None  # [1, 1, q_len, seq_len] bool, True = attend


@dataclass
class TorchNativeMetadata:
    max_len: int = 0  # decode: the longest sequence of the batch (the padded length of every row group)
    seq_lens_host: Optional[List[int]] = None  # decode, gather path: the batch's lengths, read to the host once a forward
    ragged: bool = False  # decode: some sequence is shorter than max_len (its padding is masked out)
    extend_reqs: Optional[List[ExtendRequest]] = None  # extend: one entry per request
    # extend through the CPU kernel: (req_pool_indices, prefix_lens, extend_lens), int64
    fused_extend: Optional[tuple] = None
    fused_decode: bool = False  # decode through the CPU kernel: nothing else is needed
    # decode or extend over a quantized pool through the CPU kernel: (req_pool_indices, prefix_lens, extend_lens)
    quant_rows: Optional[tuple] = None
    # extend over a quantized pool, no request with a cached prefix: (row table, rows, prefix_lens, extend_lens) that
    # make extend_attention read the batch's own fresh k/v [N, KV, D]
    fresh_rows: Optional[tuple] = None
    # a pool with a recent window: the forward's ring bookkeeping (mem_cache/recent_window.py)
    tail: Optional[WindowTail] = None
    tail_host: Optional[tuple] = None  # the gather path's host copy of the tail (WindowTail.host_lists), once a forward
    stored_kv: Optional[tuple] = None  # (layer id, new k, new v in the stored basis) of the layer last computed
    ring_written: Optional[int] = None  # the layer whose new tokens the kernel already put into the ring


class TorchNativeAttnBackend(AttentionBackend):
    """Holds no persistent buffers; its declared transients (extend_attention, decode_gather) bound the scratch of
    one forward: decode gathers at most DECODE_GATHER_TOKENS tokens per layer at once."""

    backend_name = "torch_native"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.forward_metadata: Optional[TorchNativeMetadata] = None
        pool = self.token_to_kv_pool
        self.cpu_decode_ops = fused_cpu_decode_ops(
            self.device, getattr(self.model_config, "dtype", None), pool.dtype, getattr(pool, "store_dtype", pool.dtype),
            getattr(pool, "head_dim", 0), getattr(pool, "v_head_dim", None))
        self.cpu_extend_ops = self.cpu_decode_ops if hasattr(self.cpu_decode_ops, "extend_attention") else None
        self.cpu_quant_ops = fused_cpu_quant_ops(
            self.device, getattr(self.model_config, "dtype", None), getattr(pool, "kv_format", ""),
            getattr(pool, "head_dim", 0), getattr(pool, "v_head_dim", None))
        self.cpu_quant_write = getattr(self.cpu_quant_ops, "kv_quant_write", None)
        self.quant_operands = QuantOperandCache(pool)  # the kernel path's per-layer operands (made on first use)
        # the decode row-group bound the plan's decode_gather transient was declared with (mem_plan/kv_quant.py)
        self.decode_gather_tokens = decode_gather_tokens(getattr(pool, "kv_format", ""), DECODE_GATHER_TOKENS)
        # a quantized pool: the new tokens' fresh K/V are attended instead of their codes (the kernel and the gather
        # path); False reads them back through the codes, as FlashInfer's paged API does (its tests compare so)
        self.fresh_reads = is_quantized(getattr(pool, "kv_format", ""))
        self.windowed = WindowedTorchAttention(self)  # windowed / sink / capped layers (torch_native_window.py)
        self.mla = MLATorchAttention(self) if getattr(pool, "is_mla", False) else None  # latent pool: torch_native_mla

    # ------------------------------------------------------------------ metadata (once per forward)
    def init_forward_metadata(self, forward_batch: "ForwardBatch") -> None:
        self._init_metadata(forward_batch)
        self.windowed.reset(forward_batch)
        window, fb = getattr(self.token_to_kv_pool, "window", None), forward_batch
        if window is not None:  # the tail: each request's recent window rows, then its new tokens
            if fb.forward_mode.is_extend():
                ext = torch.tensor(fb.extend_seq_lens_cpu or fb.extend_seq_lens.tolist(), dtype=torch.int64)
                pre, most = fb.seq_lens.cpu().to(torch.int64) - ext, int(ext.max())
            else:
                pre, ext, most = fb.seq_lens - 1, torch.ones_like(fb.seq_lens), 1
            md = self.forward_metadata
            md.tail = t = window.tail(fb.req_pool_indices, pre, ext, fb.out_cache_loc, self.req_to_token_pool.req_to_token, most)
            if md.quant_rows is None and self.fresh_reads:  # the gather path (_fresh): one host copy a forward
                md.tail_host = t.host_lists()

    def _init_metadata(self, forward_batch: "ForwardBatch") -> None:
        fb, device = forward_batch, forward_batch.seq_lens.device
        seq_lens_cpu: List[int] = fb.seq_lens_cpu or fb.seq_lens.tolist()
        if fb.forward_mode.is_extend():
            extend_lens = fb.extend_seq_lens_cpu or (fb.extend_seq_lens.tolist() if fb.extend_seq_lens is not None else None)
            prefix_lens = fb.extend_prefix_lens_cpu or (fb.extend_prefix_lens.tolist()
                                                        if fb.extend_prefix_lens is not None else None)
            if prefix_lens is None:
                prefix_lens = [s - e for s, e in zip(seq_lens_cpu, extend_lens)]
            extend_lens = extend_lens or [s - p for s, p in zip(seq_lens_cpu, prefix_lens)]
            if self.cpu_extend_ops is not None or self.cpu_quant_ops is not None:
                lens = torch.tensor([prefix_lens, extend_lens], dtype=torch.int64)
                rows = (fb.req_pool_indices.to(torch.int64), lens[0], lens[1])
                if self.cpu_quant_ops is None:
                    self.forward_metadata = TorchNativeMetadata(fused_extend=rows)
                elif max(prefix_lens) == 0:
                    self.forward_metadata = TorchNativeMetadata(fresh_rows=self._fresh_rows(extend_lens))
                else:
                    self.forward_metadata = TorchNativeMetadata(quant_rows=rows)
                return
            self.forward_metadata = TorchNativeMetadata(extend_reqs=self._extend_requests(
                fb, seq_lens_cpu, prefix_lens, extend_lens, device))
            return

        if self.cpu_decode_ops is not None:
            self.forward_metadata = TorchNativeMetadata(fused_decode=True)
            return
        if self.cpu_quant_ops is not None:  # a decode step = an extend of one token over seq_len - 1 cached ones
            lens = torch.tensor(seq_lens_cpu, dtype=torch.int64)
            self.forward_metadata = TorchNativeMetadata(
                quant_rows=(fb.req_pool_indices.to(torch.int64), lens - 1, torch.ones_like(lens)))
            return
        # the slot tables are built per row group in forward_decode: nothing of size B x max_len is held
        max_len = max(seq_lens_cpu)
        self.forward_metadata = TorchNativeMetadata(max_len=max_len, ragged=min(seq_lens_cpu) != max_len,
                                                    seq_lens_host=list(seq_lens_cpu))

    @staticmethod
    def _fresh_rows(extend_lens: List[int]) -> tuple:
        """Request b's tokens are rows [start_b, start_b + len_b) of the batch's k/v: a table of those row numbers."""
        bs, width = len(extend_lens), max(extend_lens)
        ext = torch.tensor(extend_lens, dtype=torch.int64)
        starts = torch.cumsum(ext, 0) - ext
        table = (starts[:, None] + torch.arange(width)[None, :]).clamp_max(int(ext.sum()) - 1)
        return table, torch.arange(bs), torch.zeros(bs, dtype=torch.int64), ext

    def _extend_requests(self, fb, seq_lens_cpu, prefix_lens, extend_lens, device) -> List[ExtendRequest]:
        reqs, start = [], 0
        for b, (seq_len, prefix, ext) in enumerate(zip(seq_lens_cpu, prefix_lens, extend_lens)):
            req = ExtendRequest(start, ext)
            if prefix > 0:
                req.kv_indices = self.req_to_token_pool.req_to_token[fb.req_pool_indices[b : b + 1], :seq_len]
                q_pos = torch.arange(prefix, seq_len, device=device)  # sequence position of each new token
                req.attn_mask = (torch.arange(seq_len, device=device)[None, :] <= q_pos[:, None]).view(1, 1, ext, seq_len)
            reqs.append(req)
            start += ext
        return reqs

    # ------------------------------------------------------------------ per layer
    def _gather_kv(self, layer: AttentionLayer, kv_indices: torch.Tensor, dtype: torch.dtype, rotated: bool = False):
        """kv_indices: [B, Lk] -> k, v: [B, KV, Lk, D] (transposed views of one contiguous gather each). A quantized
        pool dequantizes only these rows (rotated=True: a rotated format's rows stay in its rotated basis)."""
        bs, max_len = kv_indices.shape
        k, v = self.token_to_kv_pool.gather_kv(layer.layer_id, kv_indices.reshape(-1), dtype, rotated)  # [B*Lk, KV, D]
        k = k.view(bs, max_len, k.shape[1], k.shape[2]).transpose(1, 2)
        v = v.view(bs, max_len, v.shape[1], v.shape[2]).transpose(1, 2)
        return k, v

    def _rotated_attention(self, q: torch.Tensor, layer: AttentionLayer, kv_indices: torch.Tensor, attend,
                           fresh: Optional[tuple] = None):
        """attend(q, k, v) over the gathered rows. A pool that stores K (V) in a rotated basis x @ R gives them
        rotated; the query is turned by R_k (q.k unchanged: R orthonormal) and the output back by R_v^T, so no
        stored row is ever turned back. q [..., D]; returns [..., Dv]. fresh = (k, v [n, KV, D], rows, cols): a
        quantized pool's gathered rows (rows[i], cols[i]) are this forward's new tokens, attended as computed."""
        pool = self.token_to_kv_pool
        r_k, r_v = pool.rotation("k"), pool.rotation("v")
        rotated = r_k is not None or r_v is not None
        k_all, v_all = self._gather_kv(layer, kv_indices, q.dtype, rotated)
        if fresh is not None and self.fresh_reads:
            k_new, v_new, rows, cols = fresh
            for dst, x, r in ((k_all, k_new, r_k), (v_all, v_new, r_v)):  # dst [B, KV, Lk, D] views
                dst[rows, :, cols, :] = (x.float() if r is None else x.float() @ r).to(dst.dtype)
        if r_k is not None:
            q = (q.float() @ r_k).to(q.dtype)
        out = attend(q, k_all, v_all)
        if r_v is not None:
            out = (out.float() @ r_v.T).to(out.dtype)
        return out

    def _stored_kv(self, layer: AttentionLayer, k: torch.Tensor, v: torch.Tensor):
        """The new K/V in the pool's stored basis, fp32 (the kernel's fresh rows, the ring's entries), once a layer."""
        md, pool = self.forward_metadata, self.token_to_kv_pool
        if md.stored_kv is None or md.stored_kv[0] != layer.layer_id:
            md.stored_kv = (layer.layer_id, pool.stored_basis(layer.layer_id, "k", k), pool.stored_basis(layer.layer_id, "v", v))
        return md.stored_kv[1], md.stored_kv[2]

    def _fresh(self, layer: AttentionLayer, k: torch.Tensor, v: torch.Tensor, reqs) -> tuple:
        """The rows the gather path attends uncompressed, as (k, v, gathered row, position) for _rotated_attention.
        reqs = [(gathered row, request b, its length, its first new token's q row, new tokens)]: a request's new
        tokens, and with a recent window its ring's entries before them and its sink entries (its first tokens:
        mem_cache/recent_window.py)."""
        md, pool, lid = self.forward_metadata, self.token_to_kv_pool, layer.layer_id
        t = md.tail
        counts, sinks, ring_rows, ring_src = md.tail_host if t is not None else (None, None, None, None)
        ring_k, ring_v = pool.window.ring(lid) if t is not None else (None, None)
        idx = lambda x: torch.tensor(x, dtype=torch.int64, device=k.device)  # noqa: E731
        ks, vs, rows, cols = [], [], [], []
        for row, b, length, q_first, n_new in reqs:
            w, s = (counts[b], sinks[b]) if counts else (0, 0)
            first = pool.window.sink_entries(ring_rows[b], 0) if s else 0
            entries = [*range(first, first + s), *(ring_src[b][len(ring_src[b]) - w:] if w else [])]
            if entries:  # its sink and ring rows (stored basis, bf16) back in the gather basis
                e = idx(entries)
                ks.append(pool.plain_basis(lid, "k", ring_k[e]).to(k.dtype))
                vs.append(pool.plain_basis(lid, "v", ring_v[e]).to(v.dtype))
            ks.append(k[q_first : q_first + n_new])
            vs.append(v[q_first : q_first + n_new])
            rows += [row] * (s + w + n_new)
            cols += [*range(s), *range(length - n_new - w, length)]
        return torch.cat(ks), torch.cat(vs), idx(rows), idx(cols)

    def _quant_attention(self, q: torch.Tensor, layer: AttentionLayer, save_kv_cache: bool, k: torch.Tensor,
                         v: torch.Tensor) -> torch.Tensor:
        """Every row of q over the quantized pool's codes, in place (extend_attention_quant); q [N, H, D]. Keys stored
        turned (k @ R; int4's (k * w) @ R): the kernel turns each query row (q / w) by R in its fp32 scratch (q.k
        unchanged); values stored turned (int4, int2_hadamard): it turns each output row back by R^T."""
        if not save_kv_cache:
            raise NotImplementedError("torch_native CPU attention over a quantized pool reads the new K/V from the "
                                      "pool (save_kv_cache=True).")
        o, md = self.quant_operands(layer.layer_id), self.forward_metadata
        fresh = self._stored_kv(layer, k, v) if self.fresh_reads else (None, None)
        return self.cpu_quant_ops.extend_attention_quant(
            q, o.k_codes, o.v_codes, o.k_scale, o.v_scale, self.token_to_kv_pool.kv_format,
            self.req_to_token_pool.req_to_token, *md.quant_rows, layer.scaling, o.k_turn, o.k_smooth, o.v_back,
            *fresh, *self._ring_args(layer, o))

    def _ring_args(self, layer: AttentionLayer, o) -> tuple:
        """The kernel's recent-window operands (ring_k, ring_v, ring_rows, ring_counts, ring_write, sink_counts,
        sink_write, ring_window), or Nones: it reads the ring (and the sinks), then writes the new tokens into it (so
        _remember has nothing left to do for this layer)."""
        md = self.forward_metadata
        if md.tail is None or not self.fresh_reads:
            return None, None, None, None, None, None, None, 0
        md.ring_written, t = layer.layer_id, md.tail
        return (o.ring_k, o.ring_v, t.ring_rows, t.counts, t.write_entry, t.sink_counts, t.sink_entry,
                self.token_to_kv_pool.window.window)

    def _write_kv(self, layer: AttentionLayer, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """The new K/V into the pool: a pool the kernels read is written by the kernel module too (the codec's rule in
        registers, the stored-turned parts turned; kv_quant_write), every other pool (and a calibrating one, which
        records what it is given) by its own set_kv_buffer."""
        pool = self.token_to_kv_pool
        if self.cpu_quant_write is None or pool.calibrating:
            pool.set_kv_buffer(layer.layer_id, loc, k, v)
            return
        lid, loc, o = layer.layer_id, loc.to(torch.int64).contiguous(), self.quant_operands(layer.layer_id)
        # the rows as stored (fp32, turned) come back too where they are read: the kernel attends them as the
        # forward's new tokens, the recent window keeps them (a prefill without a cached prefix needs neither)
        md = self.forward_metadata
        keep = md.quant_rows is not None or md.tail is not None
        sk = torch.empty(k.shape, dtype=torch.float32, device=k.device) if keep else None
        sv = torch.empty(v.shape, dtype=torch.float32, device=v.device) if keep else None
        self.cpu_quant_write(k.contiguous(), o.k_codes, o.k_scale, loc, pool.kv_format, o.k_turn, o.k_smooth, sk)
        self.cpu_quant_write(v.contiguous(), o.v_codes, o.v_scale, loc, pool.kv_format, o.v_turn, None, sv)
        if keep:
            md.stored_kv = (lid, sk, sv)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True) -> torch.Tensor:
        return self._forward(self._forward_extend, q, k, v, layer, forward_batch, save_kv_cache)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True) -> torch.Tensor:
        return self._forward(self._forward_decode, q, k, v, layer, forward_batch, save_kv_cache)

    def _forward(self, path, q, k, v, layer, forward_batch, save_kv_cache: bool) -> torch.Tensor:
        if self.mla is not None and is_mla_layer(layer, self.token_to_kv_pool):
            return self.mla.forward(q, k, layer, forward_batch, save_kv_cache)
        out = (self.windowed.forward if needs_window_path(layer) else path)(q, k, v, layer, forward_batch, save_kv_cache)
        self._remember(layer, k, v)
        return out

    def _remember(self, layer: AttentionLayer, k: torch.Tensor, v: torch.Tensor) -> None:
        """A recent window: the new tokens into their ring entries, after the layer's attention read the old ones."""
        md = self.forward_metadata
        if md.tail is not None and md.ring_written != layer.layer_id:
            self.token_to_kv_pool.window.write(layer.layer_id, *self._stored_kv(layer, k, v), md.tail)

    def _forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True) -> torch.Tensor:
        # q: [N, H, D], k/v: [N, KV, D] -> [N, H * Dv]
        if save_kv_cache:
            self._write_kv(layer, forward_batch.out_cache_loc, k, v)
        md = self.forward_metadata
        if md.quant_rows is not None:
            return self._quant_attention(q, layer, save_kv_cache, k, v)
        if md.fresh_rows is not None:  # no cached prefix: the new tokens' own K/V, as the torch path attends them
            return self.cpu_quant_ops.extend_attention(q, k.contiguous(), v.contiguous(), *md.fresh_rows, layer.scaling)
        if md.fused_extend is not None:
            if not save_kv_cache:
                raise NotImplementedError("torch_native CPU extend reads the new K/V from the pool (save_kv_cache=True).")
            pool = self.token_to_kv_pool
            return self.cpu_extend_ops.extend_attention(
                q, pool.get_key_buffer(layer.layer_id), pool.get_value_buffer(layer.layer_id),
                self.req_to_token_pool.req_to_token, *md.fused_extend, layer.scaling)
        num_heads = q.shape[1]
        outs = []
        for b, req in enumerate(md.extend_reqs):
            rows = slice(req.q_start, req.q_start + req.q_len)
            q_b = q[rows].transpose(0, 1).unsqueeze(0)  # [1, H, q_len, D]
            if req.kv_indices is None:  # no cached prefix: causal attention over the new tokens only
                out = F.scaled_dot_product_attention(
                    q_b, k[rows].transpose(0, 1).unsqueeze(0), v[rows].transpose(0, 1).unsqueeze(0),
                    is_causal=True, scale=layer.scaling, enable_gqa=True)
            else:
                fresh = self._fresh(layer, k, v, [(0, b, req.kv_indices.shape[1], req.q_start, req.q_len)])
                out = self._rotated_attention(q_b, layer, req.kv_indices, lambda qq, kk, vv: F.scaled_dot_product_attention(
                    qq, kk, vv, attn_mask=req.attn_mask, scale=layer.scaling, enable_gqa=True), fresh)  # [1, KV, seq_len, D]
            outs.append(out[0].transpose(0, 1).reshape(req.q_len, num_heads * layer.v_head_dim))  # [1, H, q, Dv] -> [q, H * Dv]
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def _forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True) -> torch.Tensor:
        # q: [B, H, D], k/v: [B, KV, D] -> [B, H * Dv]
        md = self.forward_metadata
        if md.fused_decode:
            if not save_kv_cache:
                raise NotImplementedError("torch_native CPU decode always writes the new K/V (save_kv_cache=True).")
            pool = self.token_to_kv_pool
            return self.cpu_decode_ops.decode_attention(
                q, k, v, pool.get_key_buffer(layer.layer_id), pool.get_value_buffer(layer.layer_id),
                self.req_to_token_pool.req_to_token, forward_batch.req_pool_indices, forward_batch.seq_lens,
                forward_batch.out_cache_loc, layer.scaling)
        if save_kv_cache:
            self._write_kv(layer, forward_batch.out_cache_loc, k, v)
        if md.quant_rows is not None:
            return self._quant_attention(q, layer, save_kv_cache, k, v)
        bs = q.shape[0]
        # Rows are processed in groups of at most DECODE_GATHER_TOKENS padded tokens, so the per-layer slot table,
        # mask and gathered K/V never exceed the workspace declared for this backend, whatever the batch and context.
        rows = max(1, self.decode_gather_tokens // md.max_len)
        outs = [self._decode_rows(q[s : s + rows], layer, forward_batch.req_pool_indices[s : s + rows],
                                  forward_batch.seq_lens[s : s + rows], md.max_len, md.ragged,
                                  (k, v, s, md.seq_lens_host[s : s + rows]))
                for s in range(0, bs, rows)]
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def _decode_rows(self, q, layer, req_rows, seq_lens, max_len: int, ragged: bool, new_kv=None) -> torch.Tensor:
        """new_kv = (k, v, first request, its lengths as a host list: the metadata's, never read here)."""
        kv_indices = self.req_to_token_pool.req_to_token[req_rows, :max_len]  # [b, max_len], a copy
        attn_mask = None
        if ragged:
            valid = torch.arange(max_len, device=q.device)[None, :] < seq_lens[:, None]  # [b, max_len]
            kv_indices.masked_fill_(~valid, 0)  # req_to_token past seq_len is uninitialised
            attn_mask = valid.view(-1, 1, 1, max_len)
        bs, num_heads, head_dim = q.shape
        num_kv_heads = self.token_to_kv_pool.head_num
        q_grouped = q.view(bs, num_kv_heads, num_heads // num_kv_heads, head_dim)  # [B, KV, G, D]
        out = self._rotated_attention(q_grouped, layer, kv_indices, lambda qq, kk, vv: F.scaled_dot_product_attention(
            qq, kk, vv, attn_mask=attn_mask, scale=layer.scaling),  # k, v gathered [b, KV, Lk, D]
            self._fresh(layer, new_kv[0], new_kv[1],  # row i = request s + i, its new token at seq_len - 1
                        [(i, new_kv[2] + i, n, new_kv[2] + i, 1) for i, n in enumerate(new_kv[3])])
            if new_kv is not None and self.fresh_reads else None)
        return out.reshape(bs, num_heads * layer.v_head_dim)  # [B, KV, G, Dv] -> [B, H * Dv]


BACKEND_CLASS = TorchNativeAttnBackend

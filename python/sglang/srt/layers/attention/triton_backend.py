"""TritonAttnBackend: the project's Triton kernels (layers/attention/triton_ops) over the paged KV pool.

Runs on CUDA and ROCm GPUs, and on a CPU under the Triton interpreter (TRITON_INTERPRET=1 in the environment before
the process starts: slow, for tests and debugging). Per forward, `init_forward_metadata` fills the small index
buffers once; each layer then writes its new K/V to the pool (as torch_native does) and calls one kernel launch
(extend) or two (decode: split-KV partials + merge). The kernels read each request's K/V in place through
req_to_token, so no per-step KV index list is built and any page size works.

Planned buffers (mem_plan/backends.py, allocated once by AttentionBackend.__init__, exactly as declared):
  attn_logits fp32 [R, H_q, num_kv_splits, Dv], attn_lse fp32 [R, H_q, num_kv_splits]: the split-KV decode
      workspace; decode batch b uses row b (B <= R request slots). num_kv_splits = --triton-attention-num-kv-splits.
  qo_start int32 [S + 1]: extend, where each sequence's new tokens start in q (exclusive prefix sum of extend lens);
      S = R + the request table's branch rows (a speculative tree's side branches are sequences of their own).
  cuda_graph_attn_logits / cuda_graph_attn_lse [G, ...]: the same workspace for decode under CUDA graphs
      (G = --cuda-graph-max-bs; init_forward_metadata_capture_cuda_graph). No kv-index buffers: the kernels read
      req_to_token and derive the splits from seq_lens.
  kv_rotation fp32 [parts, D, D]: with a rotated --kv-cache-dtype (int4, int2_hadamard) the pool's rotation per
      rotated part; the query (and a forward's fresh K/V) turn by it before the kernels, the output back after.

A quantized pool (fp8 with per-(layer, head) scales, int8, int4, int2_hadamard) is read in place: each launch gets
the layer's views of the pool's code and scale buffers (triton_ops/kv_formats.py), also under CUDA graphs. A forward
attends its own new tokens as computed (their fresh K/V in the stored basis: an extend's loop over k/v, a decode's
current token folded in by the merge) and only the tokens of earlier forwards through their codes; the new K/V are
written all the same, for later forwards. A plain pool's decode reads the just-written row from the pool.

A pool with a recent window (int4, int2_hadamard, fp8: mem_cache/recent_window.py) is read as torch_native reads it:
each forward's WindowTail (RecentWindow.tail, once per forward) says which of a request's newest cached tokens (counts)
and of its first ones (sink_counts: the attention sinks) the kernels read from the ring's bf16 rows instead of their
codes (kv_formats.ring_operands), and after each layer's attention the new tokens' K/V in the stored basis
(QuantizedKVPool.stored_basis, the same rows the kernels attend as fresh) go into the ring, a request's first S also
into its sink entries (RecentWindow.write). tail() builds only fixed-shape device tensors for a decode step; under a
CUDA graph it runs inside the captured forward (its first layer), so every replay recomputes it from the graph's inputs.

MLA (DeepSeek V2/V3, Kimi-K2; mem_cache/mla_pool.py, pool.is_mla): the model calls every layer in the absorbed form,
q [N, H, kv_lora + rope], k [N, 1, kv_lora + rope] (the latent row), v = k[..., :kv_lora]. The pool stores the row
once; decode runs triton_ops/mla_decode.py (split-KV over the latent rows, each block loaded once for keys and
values, the same planned attn_logits / attn_lse: the plan's MLA v_head_dim is kv_lora), extend mla_extend.py (the
cached prefix through req_to_token, then the new rows causally). The output is latent [N, H * kv_lora].

Windowed / sink / capped layers (layers/radix_attention.py): each launch gets the layer's sliding window, sinks and
logit cap, and for a layer in a windowed pool with a slot map (mem_cache/swa_pool.py) that map, through which the
kernels read req_to_token's slots; the kernels read no position below the window (_window_args).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional, Sequence

import torch

from sglang.srt.layers.attention.planned_gpu_backend import PlannedGpuAttnBackend
from sglang.srt.mem_cache import kv_quant_codec
from sglang.srt.mem_cache.recent_window import WindowTail
from sglang.srt.mem_plan.kv_quant import rotated_parts

if TYPE_CHECKING:
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch


def triton_interpreter_enabled() -> bool:
    """Whether triton runs kernels in its CPU interpreter (TRITON_INTERPRET, read the way triton reads it). False
    without triton; a triton too old for the kernels raises ImportError naming its version (triton_ops/jit_mode.py)."""
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        return False
    from sglang.srt.layers.attention.triton_ops.jit_mode import interpreted

    return interpreted()


@dataclass
class TritonMetadata:
    qo_start: Optional[torch.Tensor] = None  # extend: int32 [B + 1], a view of the planned qo_start buffer
    prefix_lens: Optional[torch.Tensor] = None  # extend: [B] cached tokens per request
    extend_lens: Optional[torch.Tensor] = None  # extend: [B] new tokens per request
    max_extend_len: int = 0
    max_seq_len: Optional[int] = None  # decode: the longest sequence, when the host knows it (sizes the split grid)
    cuda_graph: bool = False  # decode under a CUDA graph: full split grid, the graph workspace
    tail: Optional[WindowTail] = None  # a pool with a recent window: this forward's ring bookkeeping
    # decode under a CUDA graph with a window: the tail is made by the forward itself (its first layer), so the
    # graph holds its kernels; tail_layers = the layers that used it (one seen again: a new forward)
    graph_tail: bool = False
    tail_layers: set = field(default_factory=set)


class TritonAttnBackend(PlannedGpuAttnBackend):
    backend_name = "triton"
    kernel_module = "triton"
    install_hint = "pip install triton"

    @classmethod
    def device_problem(cls, device: str) -> Optional[str]:
        try:
            interpreter = triton_interpreter_enabled()
        except ImportError as e:  # a triton too old for the kernels: reported at startup, naming both versions
            return str(e)
        if not str(device).startswith("cpu"):
            return super().device_problem(device)
        if interpreter:
            return None
        return (f"it needs {cls.device_kind}; on a CPU it runs only under the Triton interpreter "
                "(start the process with TRITON_INTERPRET=1 in its environment: slow, for testing)")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        if str(self.device).startswith("cpu") and self.device_problem(self.device):
            raise RuntimeError(f"--attention-backend triton: {self.device_problem(self.device)}")
        from sglang.srt.layers.attention import triton_ops  # imports triton; only once this backend is chosen
        from sglang.srt.layers.attention.triton_ops.jit_mode import interpreted

        from sglang.srt.layers.attention.triton_ops import kv_formats

        self.ops = triton_ops
        self.kv_formats = kv_formats  # the pool's buffers as kernel operands; the host side of rotated formats
        if interpreted() and getattr(self.model_config, "dtype", None) == torch.bfloat16:
            # the interpreter runs tl.dot through numpy, which has no bfloat16: its bf16 products are wrong
            raise ValueError("--attention-backend triton under TRITON_INTERPRET=1 cannot run bfloat16 (the Triton "
                             "interpreter computes bf16 dot products wrongly): use --dtype float32 or float16.")
        if interpreted():
            from sglang.srt.layers.attention.triton_ops.interpreter_blas import use_single_threaded_blas

            use_single_threaded_blas()
        self.forward_metadata: Optional[TritonMetadata] = None
        self.rotations = self._rotations()
        self.window = getattr(self.token_to_kv_pool, "window", None)
        if self.window is not None and kv_formats.value_mean(self.token_to_kv_pool, 0) is not None:
            raise ValueError("triton: a recent window holds V with its mean, the kernels attend V less it")

    def _rotations(self) -> dict:
        """A rotated KV format's matrices R [D, D] fp32 per rotated part ("k", "v"), in the planned kv_rotation
        buffer (a CUDA graph reads them from there); {} for the other formats."""
        pool = self.token_to_kv_pool
        # the parts stored turned (int4 keys with their multiplier, int2_hadamard's K and V): the plan's table
        parts = list(rotated_parts(getattr(pool, "kv_format", "")))
        if not parts:
            return {}
        buf = self.buffers.get("kv_rotation")
        if buf is None or buf.shape[0] != len(parts):
            raise ValueError(f"triton: --kv-cache-dtype {pool.kv_format} rotates {parts}, but the plan declared "
                             f"{None if buf is None else tuple(buf.shape)} for kv_rotation")
        for i, part in enumerate(parts):
            buf[i].copy_(kv_quant_codec.rotation(pool.head_dim if part == "k" else pool.v_head_dim, buf.device))
        return {part: buf[i] for i, part in enumerate(parts)}

    def _turn(self, part: str):
        """R of a part the format stores turned, else None; None too where this pool stores it plain (fp8 keys with a
        checkpoint's scales: QuantizedKVPool.plain_parts)."""
        return None if part in getattr(self.token_to_kv_pool, "plain_parts", ()) else self.rotations.get(part)

    # ------------------------------------------------------------------ metadata (once per forward)
    def init_forward_metadata(self, forward_batch: "ForwardBatch") -> None:
        fb = forward_batch
        if fb.forward_mode.is_decode():
            self.forward_metadata = TritonMetadata(max_seq_len=max(fb.seq_lens_cpu) if fb.seq_lens_cpu else None,
                                                   tail=self._decode_tail(fb))
            return
        device = fb.seq_lens.device
        extend_lens_cpu = fb.extend_seq_lens_cpu or fb.extend_seq_lens.tolist()
        extend_lens = fb.extend_seq_lens
        if extend_lens is None:
            extend_lens = torch.tensor(extend_lens_cpu, dtype=torch.int64, device=device)
        prefix_lens = fb.extend_prefix_lens
        if prefix_lens is None:
            prefix_lens = fb.seq_lens - extend_lens
        bs = fb.batch_size
        qo_start = self.buffers["qo_start"][: bs + 1]
        qo_start[0] = 0
        qo_start[1:].copy_(torch.cumsum(extend_lens, 0))
        self.forward_metadata = TritonMetadata(qo_start, prefix_lens, extend_lens, max(extend_lens_cpu))
        if self.window is not None:
            self.forward_metadata.tail = self.window.tail(fb.req_pool_indices, prefix_lens, extend_lens,
                                                          fb.out_cache_loc, self.req_to_token_pool.req_to_token,
                                                          max(extend_lens_cpu))

    def _decode_tail(self, fb) -> Optional[WindowTail]:
        """A decode step's tail (a request's seq_len - 1 cached tokens, one new): device tensors only, no host sync."""
        if self.window is None:
            return None
        return self.window.tail(fb.req_pool_indices, fb.seq_lens - 1, torch.ones_like(fb.seq_lens), fb.out_cache_loc,
                                self.req_to_token_pool.req_to_token, 1)

    def init_forward_metadata_capture_cuda_graph(self, bs: int, req_pool_indices: torch.Tensor,
                                                 seq_lens_cpu: Sequence[int],
                                                 rows_cpu: Optional[Sequence[int]] = None) -> None:
        """Decode of graph batch bs (<= the planned graph batch): the kernels read req_pool_indices and seq_lens from
        the graph's input tensors at replay, so nothing is planned per batch; the grid launches every split (a
        captured grid cannot follow the batch's lengths) and the partials go to the planned cuda_graph_* buffers. A
        recent window's tail is left to the captured forward (its first layer: _layer_tail)."""
        if not 1 <= bs <= self.inputs.graph_bs:
            raise ValueError(f"triton: graph batch {bs} is outside the planned 1..{self.inputs.graph_bs}")
        self.forward_metadata = TritonMetadata(cuda_graph=True, graph_tail=self.window is not None)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, req_pool_indices: torch.Tensor,
                                                seq_lens_cpu: Sequence[int],
                                                rows_cpu: Optional[Sequence[int]] = None) -> None:
        self.forward_metadata = TritonMetadata(cuda_graph=True, graph_tail=self.window is not None)

    # ------------------------------------------------------------------ per layer
    def _layer_tail(self, layer, fb) -> Optional[WindowTail]:
        """This forward's tail; a graph's decode makes it at its first layer (a layer seen again: the next forward)."""
        md = self.forward_metadata
        if md.graph_tail and (md.tail is None or layer.layer_id in md.tail_layers):
            md.tail, md.tail_layers = self._decode_tail(fb), set()
        md.tail_layers.add(layer.layer_id)
        return md.tail

    def _into_basis(self, q, k, v, layer, tail):
        """q, k, v in the stored basis (kv_formats.into_basis) and, with a window, the fp32 k, v there
        (QuantizedKVPool.stored_basis: the ring's entries; the fresh k, v are these in the model dtype)."""
        f, pool, lid = self.kv_formats, self.token_to_kv_pool, layer.layer_id
        r_k, r_v, v_mean, smooth = self._turn("k"), self._turn("v"), f.value_mean(pool, lid), f.key_smooth(pool, lid)
        if tail is None:
            return (*f.into_basis(q, k, v, r_k, r_v, v_mean, smooth), None)
        stored = pool.stored_basis(lid, "k", k), pool.stored_basis(lid, "v", v)
        q = f.into_basis(q, None, None, r_k, r_v, v_mean, smooth)[0]
        return q, stored[0].to(k.dtype), stored[1].to(v.dtype), stored

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True) -> torch.Tensor:
        # q: [N, H, D], k/v: [N, KV, D] -> [N, H * Dv]
        if self._is_mla(layer):
            return self._mla_extend(q, k, layer, forward_batch, save_kv_cache)
        if save_kv_cache:
            self.token_to_kv_pool.set_kv_buffer(layer.layer_id, forward_batch.out_cache_loc, k, v)
        md = self.forward_metadata
        f, pool, tail = self.kv_formats, self.token_to_kv_pool, md.tail
        # a rotated / smoothed / centred format: attend in its stored basis
        q, k, v, stored = self._into_basis(q, k, v, layer, tail)
        o = q.new_empty(q.shape[0], q.shape[1], layer.v_head_dim)
        self.ops.extend_attention_fwd(
            q, k, v, o, None, None, self.req_to_token_pool.req_to_token, forward_batch.req_pool_indices,
            md.qo_start, md.extend_lens, md.prefix_lens, md.max_extend_len, layer.scaling,
            kv=f.kv_operands(pool, layer.layer_id), ring=f.ring_operands(pool, layer.layer_id, tail),
            **self._window_args(layer, tail),
        )
        return self._finish(o, layer, stored, tail)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True) -> torch.Tensor:
        # q: [B, H, D], k/v: [B, KV, D] -> [B, H * Dv]; a plain pool's decode reads the new token from the pool
        if self._is_mla(layer):
            return self._mla_decode(q, k, layer, forward_batch, save_kv_cache)
        if save_kv_cache:
            self.token_to_kv_pool.set_kv_buffer(layer.layer_id, forward_batch.out_cache_loc, k, v)
        md = self.forward_metadata
        f, pool, tail = self.kv_formats, self.token_to_kv_pool, self._layer_tail(layer, forward_batch)
        kv = f.kv_operands(pool, layer.layer_id)
        q, k, v, stored = self._into_basis(q, k, v, layer, tail)
        o = q.new_empty(q.shape[0], q.shape[1], layer.v_head_dim)
        prefix = "cuda_graph_" if md.cuda_graph else ""
        fresh = kv.quantized  # a quantized pool: the current token's K/V as computed, not its codes
        self.ops.decode_attention_fwd(
            q, None, None, o, self.req_to_token_pool.req_to_token, forward_batch.req_pool_indices,
            forward_batch.seq_lens, self.buffers[prefix + "attn_logits"], self.buffers[prefix + "attn_lse"],
            layer.scaling, max_seq_len=md.max_seq_len, kv=kv, k_new=k if fresh else None,
            v_new=v if fresh else None, ring=f.ring_operands(pool, layer.layer_id, tail), **self._window_args(layer, tail),
        )
        return self._finish(o, layer, stored, tail)

    # ------------------------------------------------------------------ MLA (latent rows, absorbed form)
    def _is_mla(self, layer) -> bool:
        """An MLA layer over the latent pool: q / k are [N, H | 1, kv_lora + rope], V is k's first v_head_dim columns
        (mem_cache/mla_pool.py); a layer of another shape over that pool is a wiring error."""
        pool = self.token_to_kv_pool
        if not getattr(pool, "is_mla", False):
            return False
        if layer.v_head_dim != pool.kv_lora_rank:
            raise ValueError(f"triton: layer {layer.layer_id} has v_head_dim {layer.v_head_dim} over an MLA pool whose "
                             f"values are its rows' first {pool.kv_lora_rank} columns")
        return True

    def _mla_extend(self, q, k, layer, fb, save_kv_cache: bool) -> torch.Tensor:
        """New tokens over their cached latent rows and, causally, their own rows k [N, 1, L] (mla_extend.py)."""
        pool, md = self.token_to_kv_pool, self.forward_metadata
        if save_kv_cache:
            pool.set_kv_buffer(layer.layer_id, fb.out_cache_loc, k, None)
        o = q.new_empty(q.shape[0], q.shape[1], layer.v_head_dim)
        self.ops.mla_extend_fwd(q, k, o, pool.get_key_buffer(layer.layer_id), self.req_to_token_pool.req_to_token,
                                fb.req_pool_indices, md.qo_start, md.extend_lens, md.prefix_lens, md.max_extend_len,
                                layer.scaling)
        return o.view(q.shape[0], -1)

    def _mla_decode(self, q, k, layer, fb, save_kv_cache: bool) -> torch.Tensor:
        """Split-KV decode over the latent rows (mla_decode.py), the current token's row read back from the pool; the
        workspace is the planned attn_logits [R, H, splits, kv_lora] / attn_lse (AttentionShape v_head_dim)."""
        pool, md = self.token_to_kv_pool, self.forward_metadata
        if save_kv_cache:
            pool.set_kv_buffer(layer.layer_id, fb.out_cache_loc, k, None)
        o = q.new_empty(q.shape[0], q.shape[1], layer.v_head_dim)
        prefix = "cuda_graph_" if md.cuda_graph else ""
        self.ops.mla_decode_fwd(q, pool.get_key_buffer(layer.layer_id), o, self.req_to_token_pool.req_to_token,
                                fb.req_pool_indices, fb.seq_lens, self.buffers[prefix + "attn_logits"],
                                self.buffers[prefix + "attn_lse"], layer.scaling, max_seq_len=md.max_seq_len)
        return o.view(q.shape[0], -1)

    def _window_args(self, layer, tail) -> dict:
        """The kernels' window, sinks, logit cap and, for a layer in a windowed pool with a map (swa_pool.py), the
        token -> windowed slot map the kernels index req_to_token's slots through."""
        pool, window = self.token_to_kv_pool, getattr(layer, "sliding_window_size", -1)
        if window > 0 and tail is not None:
            raise ValueError("triton: a sliding-window layer over a --kv-cache-dtype with a recent window is not "
                             "wired; use a plain --kv-cache-dtype (auto, bf16) for this model")
        loc_map = getattr(pool, "slot_map", None) if pool.is_windowed_layer(layer.layer_id) else None
        return dict(sliding_window=window, sinks=getattr(layer, "sinks", None),
                    logit_cap=getattr(layer, "logit_cap", 0.0) or 0.0, loc_map=loc_map)

    def _finish(self, o, layer, stored, tail) -> torch.Tensor:
        """The kernel's o [N, H_q, Dv] out of the stored basis, [N, H_q * Dv]; a window takes the new tokens' K/V
        (stored basis, fp32) into the ring now that the layer's attention read the entries they replace."""
        if tail is not None:
            self.window.write(layer.layer_id, stored[0], stored[1], tail)
        f, lid = self.kv_formats, layer.layer_id
        return f.out_of_basis(o, self._turn("v"), f.value_mean(self.token_to_kv_pool, lid)).view(o.shape[0], -1)


BACKEND_CLASS = TritonAttnBackend

"""What rank 0 broadcasts so every TP rank runs the same forward.

Only rank 0 schedules: it owns the allocator, the radix cache and the request table, and samples. Before each model
forward it broadcasts the ForwardBatch's host fields plus what the other ranks cannot know:
    EXTEND  the full req_to_token row [0, seq_len) of every request (prefix-cache hits, retraction and chunked
            prefill all rewrite rows, and the row is what attention reads KV slots from)
    DECODE  nothing more: the one new slot per request is out_cache_loc, written at column seq_len - 1
so each rank's req_to_token holds, for every running request, the same row as rank 0's. With a quantized KV's recent
window (mem_cache/recent_window.py) also, in both modes, each request's ring row as rank 0 assigned it and the ring
rows handed out since the last forward: every rank empties those before the forward reads them (a reused row would
otherwise hold the previous request's entries on the followers only), so every rank reads the same K/V. With windowed
layers beside full ones (mem_cache/swa_pool.py) also the slot map's entries of the slots the forward names (EXTEND:
the full rows; DECODE: out_cache_loc): only rank 0's allocator sets the map, and a follower whose map stayed 0 put
every windowed layer's K/V on the dummy page. Entries a follower keeps stale (pages rank 0 freed since) lie below
every request's window, which no backend reads. Messages:
    ("forward", packed batch)   run the forward (followers discard the logits)
    ("ping", None)              nothing to run: rank 0 checks, while idle, that every rank is still there (a
                                collective with a dead rank fails), so a rank lost on another node is noticed
    ("stop", None)              leave the follower loop
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

class TpRankFailure(RuntimeError):
    """A forward failed with tensor parallelism: the ranks are out of step (or one is gone); the server must stop.
    Never confined to requests (managers/fault_confinement.FATAL_ERRORS)."""


FORWARD = "forward"
PING = "ping"
STOP = "stop"
_TENSOR_FIELDS = ("input_ids", "positions", "req_pool_indices", "seq_lens", "out_cache_loc", "extend_prefix_lens",
                  "extend_seq_lens", "logits_indices", "mrope_positions", "prompt_logprob_rows")
_LIST_FIELDS = ("seq_lens_cpu", "extend_prefix_lens_cpu", "extend_seq_lens_cpu")


def _cpu(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if t is None else t.detach().to("cpu")


def pack_forward_batch(fb: ForwardBatch, req_to_token: torch.Tensor, window=None,
                       slot_map: Optional[torch.Tensor] = None) -> dict:
    """Host copy of the batch (before move_to_device) and, for EXTEND, the requests' req_to_token rows; window: rank
    0's recent window (its ring rows follow the requests: WindowRows), or None; slot_map: rank 0's token slot ->
    windowed slot map (SWAKVPool.slot_map), or None."""
    if fb.mm_inputs is not None:
        raise RuntimeError("multimodal batches cannot run with --tp-size > 1")
    msg = {"forward_mode": int(fb.forward_mode), "batch_size": fb.batch_size, "pooling": fb.pooling,
           "prompt_logprob_block_rows": fb.prompt_logprob_block_rows}
    for name in _TENSOR_FIELDS:
        msg[name] = _cpu(getattr(fb, name))
    for name in _LIST_FIELDS:
        msg[name] = list(getattr(fb, name))
    if fb.forward_mode.is_extend():
        rows = fb.req_pool_indices.tolist()
        msg["rows"] = torch.cat([_cpu(req_to_token[row, :n]) for row, n in zip(rows, fb.seq_lens_cpu)])
    if slot_map is not None:
        named = msg["rows"] if fb.forward_mode.is_extend() else msg["out_cache_loc"]
        msg["slot_map"] = (named, _cpu(slot_map[named.to(slot_map.device, torch.int64)]))
    if window is not None and window.rows is not None:
        rows = fb.req_pool_indices.tolist()
        msg["window"] = (rows, window.rows.lookup(rows), window.rows.take_fresh())
    return msg


def unpack_forward_batch(msg: dict, req_to_token: torch.Tensor, window=None,
                         slot_map: Optional[torch.Tensor] = None) -> ForwardBatch:
    """The batch rank 0 packed, with this rank's req_to_token rows (its recent window's ring rows: window; its
    windowed slot map's entries: slot_map) brought to the same content."""
    mode = ForwardMode(msg["forward_mode"])
    fb = ForwardBatch(forward_mode=mode, batch_size=msg["batch_size"], pooling=msg.get("pooling"),
                      prompt_logprob_block_rows=msg.get("prompt_logprob_block_rows", 0),
                      **{name: msg[name] for name in _TENSOR_FIELDS + _LIST_FIELDS})
    rows = fb.req_pool_indices.tolist()
    device = req_to_token.device
    if mode.is_extend():
        start = 0
        for row, n in zip(rows, fb.seq_lens_cpu):
            req_to_token[row, :n] = msg["rows"][start : start + n].to(device, req_to_token.dtype)
            start += n
    else:
        cols = torch.tensor([n - 1 for n in fb.seq_lens_cpu], dtype=torch.int64, device=device)
        req_to_token[torch.tensor(rows, device=device), cols] = fb.out_cache_loc.to(device, req_to_token.dtype)
    if window is not None and "window" in msg:
        window.apply(*msg["window"])
    if slot_map is not None and "slot_map" in msg:
        slots, entries = msg["slot_map"]
        slot_map[slots.to(slot_map.device, torch.int64)] = entries.to(slot_map.device, slot_map.dtype)
    return fb


def stop_message() -> Tuple[str, None]:
    return (STOP, None)

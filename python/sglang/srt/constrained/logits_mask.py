"""What the sampler applies for structured output, to the whole batch at once: logit_bias, then the grammar bitmask.

apply_logit_bias_     logits[i, id] += bias for every (id, bias) of row i's logit_bias
apply_grammar_mask_   one bitmask row per constrained request (its matcher fills the host row, or the BitmaskFiller
                      did during the forward: bitmask_fill.py), one upload of the batch's rows to the logits' device
                      (token_bitmask.py), one masking pass; a constrained row left with no finite allowed logit gets
                      a uniform choice among its allowed tokens, so the grammar holds even then. A row that allows
                      no token at all (a dead end: request_grammar.py) is marked on its grammar and left unmasked,
                      so its draw cannot fail the batch; the sink ends that request with a 400 instead of committing
                      the token. Nothing here reads a device value on the host (the dead-end test reads host rows).
"""

from __future__ import annotations

from typing import Any, List, Optional

import torch

from sglang.srt.constrained.token_bitmask import TokenBitmask


def has_grammar(req: Any) -> bool:
    return getattr(req, "grammar", None) is not None


def apply_logit_bias_(logits: torch.Tensor, reqs: List[Any]) -> None:
    for i, req in enumerate(reqs):
        bias = req.sampling_params.logit_bias
        if bias:
            ids = torch.tensor([int(k) for k in bias], dtype=torch.int64, device=logits.device)
            vals = torch.tensor(list(bias.values()), dtype=logits.dtype, device=logits.device)
            logits[i].index_add_(0, ids, vals)


def apply_grammar_mask_(logits: torch.Tensor, reqs: List[Any], bitmask: Optional[TokenBitmask]) -> None:
    """logits: float32 [B, V] on the model's device; bitmask: the backend's TokenBitmask (>= B rows). No host sync:
    the rows are filled on the host, uploaded once, and applied with device ops only."""
    rows = [i for i, r in enumerate(reqs) if has_grammar(r)]
    if not rows:
        return
    assert bitmask is not None and bitmask.host.shape[0] >= len(reqs), "the grammar bitmask has a row per batch request"
    host = bitmask.host
    filled = {}  # rows the BitmaskFiller filled during the forward, for this request at this position
    for filler in {reqs[i].grammar.filler for i in rows} - {None}:
        filled.update(filler.take())
    stale = [i for i in rows if filled.get(reqs[i].grammar) != (i, reqs[i].grammar.num_accepted)]
    filler = reqs[stale[0]].grammar.filler if stale else None
    if len(stale) > 1 and filler is not None and filler.bitmask is host \
            and all(reqs[i].grammar.filler is filler for i in stale):
        filler.fill([reqs[i].grammar for i in stale], stale)  # its worker thread and this one share the rows
    else:
        for i in stale:
            reqs[i].grammar.fill_bitmask(host, i)
    _open_dead_ends_(host, reqs, rows)
    _mask_rows_(logits, bitmask.upload(len(reqs)), rows)


def _open_dead_ends_(host: torch.Tensor, reqs: List[Any], rows: List[int]) -> None:
    """Mark each filled row that allows nothing as its grammar's dead end, and set all its bits. A matcher with
    stuck() (llguidance's, which allows the stop token where it cannot go on) is asked about rows with bits set."""
    live = (host[: len(reqs)] if len(rows) == len(reqs) else host[rows]).any(dim=1).tolist()
    for k, i in enumerate(rows):
        g = reqs[i].grammar
        if live[k] and (g.stuck is None or not g.stuck(host[i])):
            continue
        g.dead_end = True
        host[i].fill_(-1)


_BYTE_TO_ADDEND = {}  # device -> float32 [256, 8]: 0 where bit j of the byte allows the token, -inf where it bans it


def _byte_table(device: torch.device) -> torch.Tensor:
    table = _BYTE_TO_ADDEND.get(device)
    if table is None:
        bits = (torch.arange(256).unsqueeze(1) >> torch.arange(8)) & 1
        table = torch.where(bits == 1, 0.0, float("-inf")).to(device=device, dtype=torch.float32)
        _BYTE_TO_ADDEND[device] = table
    return table


def bitmask_addend(words: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """float32 [R, vocab_size]: 0 where the packed bitmask rows allow a token, -inf where they ban it (bit j of word
    w = token 32 w + j, xgrammar's layout; the words' bytes read little-endian). One byte-table lookup: ~0.8 ms for
    32 x 49,152 on two cores vs ~4.6 ms for xgrammar's CPU kernel."""
    assert words.shape[1] * 32 >= vocab_size, "the grammar bitmask covers the logits' vocabulary"
    byte_ids = words.contiguous().view(torch.uint8).reshape(-1).to(torch.int32)
    table = _byte_table(words.device)
    return torch.index_select(table, 0, byte_ids).view(words.shape[0], -1)[:, :vocab_size]


def _mask_rows_(logits: torch.Tensor, words: torch.Tensor, rows: List[int]) -> None:
    """logits[rows] += addend; a row the grammar leaves with no finite logit becomes the addend itself (a uniform
    choice among its allowed tokens). Branch-free: which rows are dead is never read on the host. The logits are
    finite here (the sampler makes them so; logit_bias is finite), so this equals xgrammar's
    apply_token_bitmask_inplace on every row that keeps a finite logit."""
    every_row = len(rows) == logits.shape[0]
    index = None if every_row else torch.tensor(rows, dtype=torch.int64).to(logits.device, non_blocking=True)
    sub = logits if every_row else logits.index_select(0, index)  # [R, V]
    addend = bitmask_addend(words if every_row else words.index_select(0, index), logits.shape[1])
    sub.add_(addend)
    dead = sub.amax(dim=1, keepdim=True) == float("-inf")  # [R, 1]
    sub.masked_fill_(dead, 0.0)
    sub.add_(addend.masked_fill_(~dead, 0.0))  # dead rows: 0 + addend; the others: + 0
    if not every_row:
        logits.index_copy_(0, index, sub)

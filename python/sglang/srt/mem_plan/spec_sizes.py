"""Byte sizes and caps of speculative decoding (speculative/spec_args.py): defined here once, read by the planner,
`sglang plan` and the runtime that allocates or stays within them.

A verify forward holds every running request's last token and its proposals: at most
max_running_requests x num_draft_tokens rows, capped by the chunked-prefill size so the forward's activations stay
within the profiled prefill peak (the activation term). Each row's logits are kept, so the logits/sampler term is
that of verify_token_cap rows instead of one row per request slot.
"""

from __future__ import annotations


def verify_token_cap(max_running_requests: int, num_draft_tokens: int, chunked_prefill_size: int) -> int:
    """Most tokens one verify forward holds: every slot's num_draft_tokens, at most the chunked-prefill size (the
    activation profile's token count; -1 / 0: no chunking, no cap beyond the slots), and never fewer than one per
    slot (a decode step)."""
    full = max_running_requests * num_draft_tokens
    if chunked_prefill_size is None or chunked_prefill_size <= 0:
        return full
    return max(max_running_requests, min(full, chunked_prefill_size))

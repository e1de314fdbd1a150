"""Speculative decoding: proposers (n-gram, draft models, EAGLE heads, MTP layers), verification of the proposals in
one target forward, and the flags that select them (spec_args.py). docs/speculative_decoding.md."""

"""Prompt logprobs' memory is what the plan charges: a chunk's rows are projected a request-slot block at a time, and
one block's real peak (torch profiler, CPU) is within the `logits` term's 16 B per vocabulary entry per slot
(mem_plan/sizes.py), however many rows the chunk has; the block results equal one unblocked log_softmax."""

import os
import sys

import torch

from sglang.srt.layers.prompt_logprobs import PromptLogprobSpec, compute_prompt_logprobs
from sglang.srt.mem_plan.sizes import SAMPLER_BYTES_PER_VOCAB_ENTRY, prompt_logprob_block_rows
from sglang.test.ci.ci_register import register_cpu_ci

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "sampling"))
from alloc_peak import peak_alloc_bytes  # noqa: E402

register_cpu_ci(est_time=10, suite="cpu")

VOCAB, HIDDEN, SLOTS, ROWS = 49_152, 64, 8, 64


class _Head:
    def __init__(self):
        self.weight = torch.randn(VOCAB, HIDDEN)

    def logits(self, h):
        return h @ self.weight.t()


def test_block_peak_within_the_logits_term_and_values_exact():
    torch.manual_seed(0)
    head, hidden = _Head(), torch.randn(ROWS * 2, HIDDEN)
    rows = torch.arange(0, ROWS * 2, 2)
    spec = PromptLogprobSpec(targets=torch.randint(0, VOCAB, (ROWS,)).tolist(), top_k=[3] * ROWS,
                             token_ids=[[5, 7]] * ROWS)
    block = prompt_logprob_block_rows(SLOTS)
    out = []
    peak = peak_alloc_bytes(lambda: out.extend(compute_prompt_logprobs(hidden, rows, head, VOCAB, spec, block)))
    planned = SAMPLER_BYTES_PER_VOCAB_ENTRY * VOCAB * SLOTS
    print(f"prompt-logprob peak {peak / (VOCAB * SLOTS):.1f} B per entry per slot for {ROWS} rows "
          f"(planned {SAMPLER_BYTES_PER_VOCAB_ENTRY})")
    assert peak <= planned, (peak, planned)
    # the whole chunk at once would not fit: the blocking is what keeps it planned
    assert 8 * VOCAB * ROWS > planned
    ref = torch.log_softmax(head.logits(hidden[rows]), -1)
    for j, (lp, top, by_id, rank) in enumerate(out):
        assert abs(lp - ref[j, spec.targets[j]].item()) <= 1e-5
        assert [t for t, _ in top] == ref[j].topk(3).indices.tolist()
        assert [t for t, _ in by_id] == [5, 7] and abs(by_id[1][1] - ref[j, 7].item()) <= 1e-5
        assert rank == int((ref[j] > ref[j, spec.targets[j]]).sum()) + 1

"""TokenBitmask: where structured output's token bitmask lives, on the host and on the logits' device.

    host    int32 [R, ceil(V / 32)]  what the matchers fill (xgrammar writes host memory; bit t % 32 of word t // 32 =
            token t allowed); pinned on CUDA so the upload below is asynchronous
    device  the same shape on the model's device, the rows the sampler masks the logits with: on a CPU it is the
            host tensor itself (nothing to copy); elsewhere a buffer allocated once, the plan's grammar term

upload(B) copies the batch's B host rows to the device once per sampling step (non_blocking). The host rows are not
written again before that copy has run: the next fill starts after sampling ends, and sampling ends by reading its
next tokens back to the host, which waits for every earlier copy on the stream.

device_bytes() is what the memory plan charges for it (mem_plan/sizes.py: grammar_bitmask_bytes_per_slot x R); the
host copy on a GPU machine is host RAM, outside the device plan.
"""

from __future__ import annotations

import torch

from sglang.srt.mem_plan.sizes import GRAMMAR_BITMASK_DTYPE, grammar_bitmask_words


class TokenBitmask:
    def __init__(self, rows: int, vocab_size: int, device="cpu"):
        dtype = getattr(torch, GRAMMAR_BITMASK_DTYPE)
        shape = (rows, grammar_bitmask_words(vocab_size))
        device = torch.device(device)
        pin = device.type == "cuda" and torch.cuda.is_available()
        self.host = torch.zeros(shape, dtype=dtype, pin_memory=pin)
        self.device = self.host if device.type == "cpu" else torch.zeros(shape, dtype=dtype, device=device)

    @classmethod
    def on_host(cls, host: torch.Tensor) -> "TokenBitmask":
        """A bitmask whose device is the CPU, around an existing host tensor (tests, CPU tools)."""
        mask = cls.__new__(cls)
        mask.host = mask.device = host
        return mask

    @property
    def separate(self) -> bool:
        return self.device is not self.host

    def device_bytes(self) -> int:
        return self.device.numel() * self.device.element_size()

    def upload(self, num_rows: int) -> torch.Tensor:
        """The device rows [0, num_rows), equal to the host rows."""
        if self.separate:
            self.device[:num_rows].copy_(self.host[:num_rows], non_blocking=True)
        return self.device[:num_rows]

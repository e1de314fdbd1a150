"""The project's Triton attention kernels (paged KV through req_to_token, GQA, any page size; MLA latent rows).

Importing this package imports triton; the backend imports it only when `--attention-backend triton` is chosen.
On a CPU they run under the Triton interpreter (TRITON_INTERPRET=1, set before triton is imported).
"""

from sglang.srt.layers.attention.triton_ops import jit_mode  # noqa: F401 (first: it refuses a triton too old)
from sglang.srt.layers.attention.triton_ops.decode_attention import decode_attention_fwd
from sglang.srt.layers.attention.triton_ops.extend_attention import extend_attention_fwd
from sglang.srt.layers.attention.triton_ops.mla_decode import mla_decode_fwd
from sglang.srt.layers.attention.triton_ops.mla_extend import mla_extend_fwd

__all__ = ["decode_attention_fwd", "extend_attention_fwd", "mla_decode_fwd", "mla_extend_fwd"]

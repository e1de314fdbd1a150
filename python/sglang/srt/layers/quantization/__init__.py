"""Quantized linear layers (--quantization): which weight format each LinearBase gets, resolved once at startup.

    resolve_quantization(server_args, model_is_gguf, device, dtype) -> "none" | "gguf" | "w8a8_int8"
    with quantization_config(name): build the model   # LinearBase.__init__ asks linear_quant_method(layer)

Unset --quantization means 'gguf' for a .gguf model on CPU (the bundled default model too: llama.cpp serves it from
its Q4_1 blocks) where the quant_linear kernel runs (CPU level avx2 and up: jit_kernel/cpu_isa.py), unless --dtype
float32 is given, which stays the exact dequantized HF reference path; 'none' otherwise (tp > 1, GPUs, CPUs without
AVX2, SGLANG_CPU_KERNELS=0). Where the level has no bf16 (avx2, avx512_vnni) --dtype auto is float32 and the blocks
are served with fp32 activations.
An explicit value always wins. The transformer's linear layers and MoE experts (layers/moe/quant_experts.py) are
quantized; the norms and MoE routers (built inside dense_linear()) stay dense in --dtype, and so do the embedding and
the lm_head except under 'gguf', where the loader names the GGUF file's packed vocabulary table
(mem_plan/quantization_sizes.gguf_packed_vocab: an untied lm_head, or the embedding the lm_head is tied to) and
that table is built packed (vocab_method.py).
"""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, Iterator, Optional

if TYPE_CHECKING:
    from sglang.srt.layers.quantization.linear_method import QuantLinearMethod
    from sglang.srt.layers.quantization.vocab_method import QuantVocabMethod

QUANTIZATION_METHODS = ("none", "gguf", "w8a8_int8")

_state = threading.local()


def resolve_quantization(quantization: Optional[str], model_is_gguf: bool, device: str, explicit_float32: bool,
                         tp_size: int = 1, kernels: bool = True, checkpoint_fp8: bool = False) -> str:
    """The weight format a start uses; raises ValueError (naming the flag) for combinations that cannot work.
    kernels: whether quant_linear runs here (without it a quantized layer dequantizes per call, so unset stays
    'none', and an explicit --quantization w8a8_int8 is refused: it would be many times slower than dense).
    checkpoint_fp8: the checkpoint is fp8 blocks (fp8_block.py). Unset on a GPU then serves them with the
    block-fp8 GEMM ('fp8'); on a CPU, and with 'none', they are dequantized once at load to --dtype ('none');
    'w8a8_int8' requantizes the dequantized weights to 8-bit blocks."""
    if checkpoint_fp8 and quantization in (None, "fp8"):
        if device == "cuda":
            return "fp8"
        if quantization == "fp8":
            raise ValueError("--quantization fp8 on a CPU: the block-fp8 GEMM runs on GPUs; leave --quantization "
                             "unset (the fp8 blocks are dequantized once at load to --dtype) or use --quantization "
                             "w8a8_int8.")
        return "none"
    if quantization is None:
        served = model_is_gguf and device == "cpu" and not explicit_float32 and tp_size == 1 and kernels
        return "gguf" if served else "none"
    if quantization not in QUANTIZATION_METHODS:
        raise ValueError(f"--quantization {quantization!r} is sized by `sglang plan` only; this runtime serves "
                         f"{', '.join(QUANTIZATION_METHODS)}.")
    if quantization == "gguf" and not model_is_gguf:
        raise ValueError("--quantization gguf needs a .gguf --model-path (its blocks are served as they are); "
                         "for a safetensors checkpoint use --quantization w8a8_int8 or leave it unset.")
    if quantization != "none" and tp_size > 1:
        raise ValueError(f"--quantization {quantization} with --tp-size {tp_size}: quantized layers are not sharded "
                         "over ranks yet; use --tp-size 1 or --quantization none.")
    return quantization


@contextlib.contextmanager
def quantization_config(method: str, packed_vocab: str = "", fp8_block: tuple = (128, 128)) -> Iterator[None]:
    """Inside this block every LinearBase built takes `method`'s weights ('none': the dense weight). packed_vocab
    ('gguf' only): the vocabulary table built packed, quantization_sizes.PACKED_VOCAB_LM_HEAD (the lm_head) or
    PACKED_VOCAB_EMBEDDING (the embedding, which the tied lm_head then reads); "" keeps both dense. fp8_block
    ('fp8' only): the checkpoint's weight_block_size [rows, cols]."""
    if packed_vocab and method != "gguf":
        raise ValueError(f"a packed vocabulary table is served from a GGUF file's blocks, not with {method!r}")
    old = getattr(_state, "method", "none"), getattr(_state, "packed_vocab", ""), getattr(_state, "fp8_block", None)
    _state.method, _state.packed_vocab, _state.fp8_block = method, packed_vocab, tuple(fp8_block)
    try:
        yield
    finally:
        _state.method, _state.packed_vocab, _state.fp8_block = old


def dense_linear():
    """Layers built inside this block stay dense whatever --quantization says: MoE routers and the shared expert's
    sigmoid gate (the plan counts them in the model dtype, mem_plan/quantization_sizes.py; llama.cpp keeps routers
    unquantized too, so a GGUF's router is read dense)."""
    return quantization_config("none")


def current_quantization() -> str:
    """The method of the enclosing quantization_config block ('none' outside one)."""
    return getattr(_state, "method", "none")


def linear_quant_method(layer) -> Optional["QuantLinearMethod"]:
    """The quant method for a LinearBase being built (None: dense weight). Called by LinearBase.__init__."""
    method = current_quantization()
    if method == "none":
        return None
    if method == "fp8":  # an fp8 block checkpoint's layers on a GPU (fp8_block_linear.py)
        from sglang.srt.layers.quantization.fp8_block_linear import Fp8BlockLinearMethod

        return Fp8BlockLinearMethod(_state.fp8_block)
    from sglang.srt.layers.quantization.linear_method import QuantLinearMethod

    return QuantLinearMethod(method)


def vocab_quant_method(is_lm_head: bool) -> Optional["QuantVocabMethod"]:
    """The quant method for a vocabulary table being built (VocabParallelEmbedding / ParallelLMHead), None: dense."""
    from sglang.srt.mem_plan.quantization_sizes import PACKED_VOCAB_EMBEDDING, PACKED_VOCAB_LM_HEAD

    table = getattr(_state, "packed_vocab", "")
    if table != (PACKED_VOCAB_LM_HEAD if is_lm_head else PACKED_VOCAB_EMBEDDING):
        return None
    from sglang.srt.layers.quantization.vocab_method import QuantVocabMethod

    return QuantVocabMethod()


__all__ = ["QUANTIZATION_METHODS", "resolve_quantization", "quantization_config", "dense_linear",
           "current_quantization", "linear_quant_method", "vocab_quant_method"]

"""load_model: build the model class for a ModelConfig on a device and fill it from the checkpoint.

quantization (resolved by layers.quantization.resolve_quantization): 'none' loads dense weights of the model dtype;
'gguf' builds quantized linear layers and MoE experts, and the file's packed vocabulary table where it has one
(mem_plan/quantization_sizes.gguf_packed_vocab: the lm_head, or the embedding tied to it), and reads their tensors
as blocks from gguf_path (the rest from the converted directory; model_loader/gguf_weights.py); 'w8a8_int8'
quantizes the dense checkpoint's linear and expert weights to 8-bit blocks as they load. An fp8 block checkpoint
(quantization_config fp8 with weight_block_size) is dequantized to the model dtype as it is read
(layers/quantization/fp8_block.py), except the layers an fp8 GEMM serves ('fp8', the GPU: fp8_block_linear.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Dict, Optional

import torch
from torch import nn

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers.quantization import quantization_config
from sglang.srt.layers.quantization.fp8_block import dequantized_fp8_weights
from sglang.srt.layers.quantization.fp8_block_linear import fp8_kept_names, keep_dense_layers
from sglang.srt.layers.quantization.fp8_block_config import check_fp8_path_model, fp8_block_format
from sglang.srt.mem_plan.kv_quant import kv_scale_name
from sglang.srt.model_loader.weight_utils import safetensors_weights_iterator
from sglang.srt.models.registry import get_model_class

logger = logging.getLogger(__name__)

# packed linear weights of a converted GGUF (layers/quantization/packing.py layout), written on the first start
# v2: 8-bit blocks fitted with an offset; v3: the packed vocabulary table too; v4: each layer's format code stored
# (a v3 file's formats were inferred from record sizes, which Q6_K shares with Q8_0). Safetensors format, not named
# *.safetensors (the dense loader globs those).
PACKED_CACHE_FILE = "packed-gguf-v4.qweights"


@contextlib.contextmanager
def set_default_torch_dtype(dtype: torch.dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def build_model(model_config: ModelConfig, device: str = "meta", quantization: str = "none",
                packed_vocab: str = "") -> nn.Module:
    """The model with uninitialised weights of model_config.dtype on `device` ("meta" allocates nothing);
    packed_vocab: the vocabulary table built packed ('gguf' only; layers/quantization/quantization_config)."""
    cls = get_model_class(model_config.architecture)
    fp8 = fp8_block_format(getattr(model_config.hf_config, "quantization_config", None)) if quantization == "fp8" \
        else None
    block = (fp8.block_n, fp8.block_k) if fp8 is not None else (128, 128)
    if fp8 is not None:
        check_fp8_path_model(model_config.hf_config)
    with (set_default_torch_dtype(model_config.dtype), torch.device(device),
          quantization_config(quantization, packed_vocab, block)):
        model = cls(model_config.hf_config)
    if fp8 is not None:
        keep_dense_layers(model, fp8)
    return model


@contextlib.contextmanager
def _torch_threads(n: int):
    old = torch.get_num_threads()
    if n != old:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if n != old:
            torch.set_num_threads(old)


def _quantized_modules(model: nn.Module):
    return [(n, m) for n, m in model.named_modules() if getattr(m, "quant_method", None) is not None]


def _cache_key(module_name: str, buffer: str) -> str:
    return f"{module_name}.{buffer}"


def _load_packed_cache(model: nn.Module, path: str) -> None:
    """Give every quantized layer (linear layers, MoE experts) its packed buffers from the cache."""
    from safetensors import safe_open

    with safe_open(path, framework="pt", device="cpu") as f:
        modules = _quantized_modules(model)
        want = {_cache_key(n, b) for n, m in modules for b in m.quant_method.PACKED_BUFFERS}
        if want != set(f.keys()):
            raise ValueError(f"{path} does not match this model's quantized layers; delete it to rebuild it")
        for name, module in modules:
            module.quant_method.load_packed(
                module, {b: f.get_tensor(_cache_key(name, b)) for b in module.quant_method.PACKED_BUFFERS})


def _as_tensor(value) -> torch.Tensor:
    """A packed buffer, or a layer's integer field (its format code) as a one-element int32 tensor."""
    return value if isinstance(value, torch.Tensor) else torch.tensor([int(value)], dtype=torch.int32)


def _save_packed_cache(model: nn.Module, path: str) -> None:
    """Write the packed weights next to the converted checkpoint (temporary file, then rename: whole or absent)."""
    from safetensors.torch import save_file

    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        save_file({_cache_key(n, b): _as_tensor(getattr(m, b)) for n, m in _quantized_modules(model)
                   for b in m.quant_method.PACKED_BUFFERS}, tmp)
        os.replace(tmp, path)
    except OSError as e:  # a read-only cache: the next start packs again
        logger.warning("Could not cache the packed weights at %s (%s)", path, e)
        with contextlib.suppress(OSError):
            os.remove(tmp)


def load_model(model_config: ModelConfig, device: str = None, quantization: str = "none",
               gguf_path: Optional[str] = None, packed_vocab: Optional[str] = None) -> nn.Module:
    """packed_vocab: gguf_packed_vocab(gguf_path)'s table, read here when None (the runner reads the file's header
    before its RSS baseline, so the parse's residue is not charged to the weights)."""
    from sglang.srt.layers.linear import prepack_dense_linear_weights
    from sglang.srt.layers.quantization.linear_method import finalize_quantized_layers

    device = device or model_config.device
    start = time.perf_counter()
    if quantization != "gguf":
        packed_vocab = ""
    elif gguf_path is None:
        raise ValueError("--quantization gguf needs the .gguf file the model directory was converted from")
    elif packed_vocab is None:
        from sglang.srt.mem_plan.quantization_sizes import gguf_packed_vocab

        packed_vocab = gguf_packed_vocab(gguf_path)[0]  # the table the plan prices packed (configs/resolved.py)
    model = build_model(model_config, device, quantization, packed_vocab)
    fp8 = fp8_block_format(getattr(model_config.hf_config, "quantization_config", None))
    kinds: Dict[str, int] = {}
    if quantization == "gguf":
        from sglang.srt.model_loader.gguf_weights import (
            is_quantized_weight_name,
            iter_gguf_quantized_weights,
            packed_vocab_weight_names,
        )

        packed_names = packed_vocab_weight_names(packed_vocab)
        cache = os.path.join(model_config.model_path, PACKED_CACHE_FILE)
        if os.path.isfile(cache):
            _load_packed_cache(model, cache)
            kinds["packed-cache"] = 1
            weights = (nw for nw in safetensors_weights_iterator(model_config.model_path)
                       if not is_quantized_weight_name(nw[0]) and nw[0] not in packed_names)
        else:
            weights = iter_gguf_quantized_weights(gguf_path, model_config.model_path, kinds, packed_names)
    else:
        weights = safetensors_weights_iterator(model_config.model_path)
        if fp8 is not None:
            weights = dequantized_fp8_weights(weights, fp8, model_config.dtype, fp8_kept_names(model, quantization))
    # fp8 KV scales (k_scale / v_scale) are no parameter: the runner gives them to the KV pool (kv_calibration.py)
    weights = (nw for nw in weights if kv_scale_name(nw[0]) is None)
    # packing is many small uint8 operators: one thread is ~10x faster than two threads' OpenMP hand-offs on a
    # busy 2-core machine (measured 0.03 vs 0.5 s for a 1536x576 Q4_1 tensor) and no slower on a quiet one
    with _torch_threads(1 if quantization != "none" else torch.get_num_threads()):
        model.load_weights(weights)
    packed = finalize_quantized_layers(model)
    prepack_dense_linear_weights(model)  # dense bf16 layers on CPUs without AMX: the VNNI layout (packed_linear.py)
    if quantization == "gguf" and "packed-cache" not in kinds:
        _save_packed_cache(model, os.path.join(model_config.model_path, PACKED_CACHE_FILE))
    model.eval()
    what = str(model_config.dtype).replace("torch.", "")
    if fp8 is not None:
        what += ", fp8 blocks " + ("served by the fp8 GEMM" if quantization == "fp8" else "dequantized at load")
    if quantization != "none":
        if "packed-cache" in kinds:
            detail = "from the packed-weights cache"
        else:
            detail = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) + " tensors" if kinds else "int8 per 32 weights"
        what += f", {packed} quantized layers ({quantization}): {detail}"
    logger.info("Loaded %s (%s) on %s in %.1f s", model_config.architecture, what, device, time.perf_counter() - start)
    return model

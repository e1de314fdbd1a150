"""load_model: build the model class for a ModelConfig on a device and fill it from the checkpoint."""

from __future__ import annotations

import contextlib
import logging
import time

import torch
from torch import nn

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.model_loader.weight_utils import safetensors_weights_iterator
from sglang.srt.models.registry import get_model_class

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def set_default_torch_dtype(dtype: torch.dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def build_model(model_config: ModelConfig, device: str = "meta") -> nn.Module:
    """The model with uninitialised weights of model_config.dtype on `device` ("meta" allocates nothing)."""
    cls = get_model_class(model_config.architecture)
    with set_default_torch_dtype(model_config.dtype), torch.device(device):
        return cls(model_config.hf_config)


def load_model(model_config: ModelConfig, device: str = None) -> nn.Module:
    device = device or model_config.device
    start = time.perf_counter()
    model = build_model(model_config, device)
    model.load_weights(safetensors_weights_iterator(model_config.model_path))
    model.eval()
    logger.info(
        "Loaded %s (%s) on %s in %.1f s",
        model_config.architecture,
        str(model_config.dtype).replace("torch.", ""),
        device,
        time.perf_counter() - start,
    )
    return model

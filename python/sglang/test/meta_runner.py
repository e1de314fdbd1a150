"""A model runner whose device is the `meta` stand-in for a GPU, for device-discipline tests of whole scheduler steps.

Everything a GPU start would put on the device is on "meta" -- the model's weights (built by the loader's own
build_model), the request table (with its host copy, as on a GPU), the KV pool, the attention backend's planned
buffers -- and everything the host keeps is real: the allocator, the radix cache, the requests, the grammar matchers.
The forward is ModelRunner's own (forward / forward_local, borrowed unchanged), so a step runs the runtime's code
from batch building to sampling; under sglang.test.device_discipline.DeviceDiscipline a device/host mix raises and
every read of device values is counted.

FlashInfer and AITER are not installed here: pass `backend="flashinfer"` inside
`attention_standins.install(make_flashinfer())` (the stand-in computes attention with torch from its arguments, on
meta tensors: shapes only). torch_native runs as it is.
"""

from __future__ import annotations

from typing import Optional

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers.attention.attention_registry import create_attention_backend
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_plan.backends import BackendInputs
from sglang.srt.mem_plan.sizes import req_to_token_row_len
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.model_loader.loader import build_model
from sglang.srt.server_args import ServerArgs

META = "meta"


class MetaModelRunner:
    forward = ModelRunner.forward
    forward_local = ModelRunner.forward_local
    capture_hidden = ModelRunner.capture_hidden  # no draft head: forwards keep no features
    captured_batch = ModelRunner.captured_batch
    cuda_graph_runner = None
    encoder_admission = None
    mm_processor = None
    tp_size = 1

    def __init__(self, model_path: str, *, backend: str = "torch_native", dtype: str = "bfloat16",
                 max_running_requests: int = 8, max_total_tokens: int = 4096, page_size: int = 1,
                 context_length: Optional[int] = 2048, chunked_prefill_size: int = 256, **server_args):
        self.server_args = ServerArgs(model_path=model_path, dtype=dtype, attention_backend=backend,
                                      page_size=page_size, context_length=context_length,
                                      max_running_requests=max_running_requests, max_total_tokens=max_total_tokens,
                                      chunked_prefill_size=chunked_prefill_size, **server_args)
        self.device = META
        self.model_path = self.tokenizer_path = model_path
        self.model_config = ModelConfig.from_pretrained(model_path, dtype=dtype, context_length=context_length,
                                                        device="cpu")
        self.dtype = self.model_config.dtype
        self.model = build_model(self.model_config, META)
        self.max_running_requests = max_running_requests
        self.max_total_num_tokens = max_total_tokens
        self.chunked_prefill_size = chunked_prefill_size
        mc = self.model_config
        self.req_to_token_pool = ReqToTokenPool(max_running_requests, req_to_token_row_len(self.context_len), META)
        self.token_to_kv_pool = MHATokenToKVPool(max_total_tokens, page_size, mc.kv_cache_dtype,
                                                 mc.num_key_value_heads, mc.head_dim, mc.num_hidden_layers, META)
        self.token_to_kv_pool_allocator = TokenToKVPoolAllocator(max_total_tokens, page_size)
        shape = mc.shape.attention_shape(self.context_len, 1, model_dtype_bytes=self.dtype.itemsize,
                                         kv_dtype_bytes=mc.kv_cache_dtype.itemsize,
                                         num_kv_splits=self.server_args.triton_attention_num_kv_splits)
        inputs = BackendInputs(shape, max_running_requests, 0, max_extend_tokens=chunked_prefill_size,
                               fused_cpu_decode=False, page_size=page_size)
        self.attn_backend = create_attention_backend(backend, model_config=mc, req_to_token_pool=self.req_to_token_pool,
                                                     token_to_kv_pool=self.token_to_kv_pool, device=META,
                                                     inputs=inputs)

    @property
    def context_len(self) -> int:
        return self.model_config.context_len

    def cuda_graph_info(self) -> dict:
        return {"enabled": False, "reason": "meta stand-in"}


def meta_scheduler(model_path: str, tokenizer=None, **kwargs):
    """A real Scheduler over a MetaModelRunner."""
    from sglang.srt.managers.scheduler import Scheduler

    runner = MetaModelRunner(model_path, **kwargs)
    return Scheduler(runner.server_args, model_runner=runner, tokenizer=tokenizer)

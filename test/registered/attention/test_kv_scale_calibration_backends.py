"""fp8 KV scale calibration (model_executor/kv_calibration.py) for each backend's scale granularity: torch_native and
Triton read one scale per (layer, KV head), FlashInfer one per layer, so for a backend that declares
per_layer_kv_scales every layer keeps the largest of its heads' calibrated scales (never smaller than a head's: no
head saturates more than calibration allows). A stand-in runner whose "model" writes known K/V per layer (each head a
different amplitude) through the real QuantizedKVPool; the expected scales are amax x headroom / fp8 max by hand, the
keys' amax that of the rows as stored, turned by the codec's R (a constant row c x ones turns to c x |ones @ R|)."""

from types import SimpleNamespace

import torch

from sglang.srt.mem_cache import kv_quant_codec
from sglang.srt.mem_cache.quantized_kv_pool import create_kv_pool
from sglang.srt.mem_plan.kv_quant import FP8_SCALE_HEADROOM
from sglang.srt.model_executor.kv_calibration import calibrate_kv_scales
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="cpu")

LAYERS, HEADS, DIM = 2, 3, 8
AMAX = torch.tensor([[1.0, 4.0, 2.0], [0.5, 0.25, 3.0]])  # K amax per (layer, head); V = 2x K


def turned_gain() -> float:
    """|ones @ R| at its largest: what turning a constant key row multiplies its amax by."""
    return float((torch.ones(DIM, dtype=torch.float64) @ kv_quant_codec.rotation(DIM).double()).abs().max())


class _Backend:
    backend_name = "standin"

    def __init__(self, per_layer: bool):
        self.per_layer_kv_scales = per_layer

    def init_forward_metadata(self, fb):
        pass

    def forward_extend(self, q, k, v, layer, fb, save_kv_cache=True):  # wrapped by recording_queries; the stand-in
        raise AssertionError("the stand-in model writes the pool itself")  # model below never attends


def _checkpoint_without_kv_scales() -> str:
    """A checkpoint directory whose safetensors carry no k_scale / v_scale: the scales are calibrated."""
    import tempfile

    from safetensors.torch import save_file

    path = tempfile.mkdtemp(prefix="kv-calib-")
    save_file({"model.embed_tokens.weight": torch.zeros(4, 4)}, f"{path}/model.safetensors")
    return path


def _runner(per_layer: bool):
    pool = create_kv_pool("fp8_e4m3", 256, 1, torch.float32, HEADS, DIM, LAYERS)

    def forward(ids, positions, fb):
        n = len(ids)
        for layer in range(LAYERS):
            k = torch.ones(n, HEADS, DIM) * 0.1
            k[0] = AMAX[layer].view(HEADS, 1)  # the row that sets each head's amax
            fb.token_to_kv_pool.set_kv_buffer(layer, fb.out_cache_loc, k, 2 * k)

    return SimpleNamespace(
        token_to_kv_pool=pool, server_args=SimpleNamespace(page_size=1, attention_backend="standin"),
        max_total_num_tokens=256, chunked_prefill_size=64, context_len=128, device="cpu",
        model_config=SimpleNamespace(vocab_size=100, model_path=_checkpoint_without_kv_scales()), model=SimpleNamespace(forward=forward),
        _attention_backend=lambda r2t, kv, num_reqs, graph_bs: _Backend(per_layer), tp_rank=0)


def test_per_head_scales_for_torch_native_and_triton():
    runner = _runner(per_layer=False)
    calibrate_kv_scales(runner)
    want = AMAX * FP8_SCALE_HEADROOM / torch.finfo(torch.float8_e4m3fn).max
    assert runner.token_to_kv_pool.turned_parts == {"k"}
    assert torch.allclose(runner.token_to_kv_pool.fixed["k_scale"], want * turned_gain())
    assert torch.allclose(runner.token_to_kv_pool.fixed["v_scale"], 2 * want)


def test_per_layer_scales_for_flashinfer():
    runner = _runner(per_layer=True)
    calibrate_kv_scales(runner)
    want = AMAX.amax(1, keepdim=True).expand(LAYERS, HEADS) * FP8_SCALE_HEADROOM / torch.finfo(torch.float8_e4m3fn).max
    pool = runner.token_to_kv_pool
    assert torch.allclose(pool.fixed["k_scale"], want * turned_gain())
    assert torch.allclose(pool.fixed["v_scale"], 2 * want)
    assert "per layer" in pool.scales_source

"""Encoder throughput of the Qwen3-Omni Thinker's towers: items/s per modality, printed, not a test.

    python benchmark/bench_encoders.py [--dtype bfloat16] [--runs 3] [--image 448x448] [--video 16x224x224]
                                       [--audio-seconds 30] [--threads N]

The towers are this runtime's own (models/qwen3_omni_vision.py, models/qwen3_omni_audio.py) at the real model's
sizes -- transformers' Qwen3OmniMoeThinkerConfig defaults for vision_config (27 blocks, hidden 1152, patch 16, merge
2, deepstack) and audio_config (32 layers, d_model 1280) -- with random weights (speed does not depend on them); the
30B text model is not built. Inputs are what the processor hands the towers: an image's patches at the stated
resolution (one encoder call), one video encoder chunk (VIDEO_CHUNK_FRAMES frames, temporal patches of 2), an audio's
log-mel frames (100 per second, 128 bins). Reported: median seconds per item over --runs timed calls after one warm-up,
and items/s = 1 / median. Decoding and preprocessing (PIL, PyAV, the log-mel) are not included.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from sglang.srt.mem_plan.encoder_inputs import MEL_FRAMES_PER_SECOND, VIDEO_CHUNK_FRAMES
from sglang.srt.models.qwen3_omni_audio import Qwen3OmniAudioEncoder
from sglang.srt.models.qwen3_omni_vision import Qwen3OmniVisionTransformer


def build(dtype: torch.dtype):
    from transformers import Qwen3OmniMoeThinkerConfig

    cfg = Qwen3OmniMoeThinkerConfig()
    torch.manual_seed(0)
    towers = (Qwen3OmniVisionTransformer(cfg.vision_config), Qwen3OmniAudioEncoder(cfg.audio_config))
    for tower in towers:
        with torch.no_grad():
            for p in tower.parameters():
                p.normal_(0.0, 0.02)
        tower.to(dtype).eval()
    return cfg, towers


def vision_input(vcfg, frames: int, height: int, width: int, dtype):
    """Patches [t*h*w, 3 * temporal * patch^2] and the (t, h, w) grid of `frames` frames of height x width pixels
    (rounded to multiples of patch x merge as the processor's resize does)."""
    p, m, tp = vcfg.patch_size, vcfg.spatial_merge_size, vcfg.temporal_patch_size
    h, w = max(height // (p * m), 1) * m, max(width // (p * m), 1) * m
    t = max(frames // tp, 1)
    return torch.randn(t * h * w, vcfg.in_channels * tp * p * p, dtype=dtype), (t, h, w)


def median_seconds(fn, runs: int) -> float:
    with torch.no_grad():
        fn()  # warm-up
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--image", default="448x448", help="HEIGHTxWIDTH of the image")
    ap.add_argument("--video", default=f"{VIDEO_CHUNK_FRAMES}x224x224", help="FRAMESxHEIGHTxWIDTH of one chunk")
    ap.add_argument("--audio-seconds", type=float, default=30.0)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    cfg, (vision, audio) = build(dtype)
    vc, ac = cfg.vision_config, cfg.audio_config
    print(f"towers: vision depth {vc.depth} hidden {vc.hidden_size} patch {vc.patch_size}; audio layers "
          f"{ac.encoder_layers} d_model {ac.d_model}; {args.dtype}; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; median of {args.runs} runs after a warm-up", flush=True)
    ih, iw = (int(v) for v in args.image.split("x"))
    vf, vh, vw = (int(v) for v in args.video.split("x"))
    mel = int(args.audio_seconds * MEL_FRAMES_PER_SECOND)
    cases = []
    x, g = vision_input(vc, 1, ih, iw, dtype)
    cases.append((f"image {ih}x{iw} ({g[1] * g[2]} patches)", lambda: vision(x, [g])))
    xv, gv = vision_input(vc, vf, vh, vw, dtype)
    cases.append((f"video chunk {vf} frames {vh}x{vw} ({gv[0] * gv[1] * gv[2]} patches)", lambda: vision(xv, [gv])))
    feats = torch.randn(ac.num_mel_bins, mel, dtype=dtype)
    cases.append((f"audio {args.audio_seconds:g} s ({mel} mel frames, {audio.num_tokens(mel)} tokens)",
                  lambda: audio([feats])))
    for name, fn in cases:
        s = median_seconds(fn, args.runs)
        print(f"{name:<52} {s:8.3f} s/item {1 / s:8.3f} items/s", flush=True)


if __name__ == "__main__":
    main()

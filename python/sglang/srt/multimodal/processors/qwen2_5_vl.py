"""Qwen2.5-VL processor: images and videos at dynamic resolution -> MultimodalInputs with M-RoPE positions.

    prompt ids with one <|image_pad|> per image and one <|video_pad|> per video (the chat template writes
    <|vision_start|><|image_pad|><|vision_end|>); a prompt without them gets those triples at its start
      image -> load_image -> qwen_vl_image.preprocess_frames (one frame, repeated to the temporal patch)
      video -> video_loader.load_video (PyAV, fps / frame limits) -> preprocess_frames (frames in pairs)
      each pad token -> grid_t * grid_h * grid_w / merge^2 pad ids (content-hash derived, as for LLaVA)
    -> MultimodalInputs: items (modality, patches, grid_thw, second_per_grid_t), mrope_positions [3, L], delta
"""

from __future__ import annotations

from typing import Any, List, Tuple

from sglang.srt.mem_plan.encoder_inputs import video_chunk_frames
from sglang.srt.multimodal.image_loader import load_image
from sglang.srt.multimodal.mm_inputs import MultimodalDataItem, MultimodalInputs, content_hash, pad_ids
from sglang.srt.multimodal.mrope_positions import mrope_positions
from sglang.srt.multimodal.processors.base_processor import BaseMultimodalProcessor, as_list, item_limits_of
from sglang.srt.multimodal.qwen_vl_image import (
    largest_grid,
    load_pixel_configs,
    num_tokens_of,
    preprocess_frames,
    resized_frame,
)
from sglang.srt.multimodal.video_loader import load_video


def split_video_into_chunks(item: MultimodalDataItem, chunk_grid_t: int, merge: int) -> None:
    """Encode a video of grid (t, h, w) in chunks of chunk_grid_t temporal slices: the tower attends within one
    slice at a time (its full-attention layers' sequences and its windows are per slice; its rotary positions are
    2-D), so the chunks' embeddings are the whole video's, and each chunk costs what the plan's video term covers."""
    t, h, w = item.metadata["grid_thw"]
    if t <= chunk_grid_t:
        return
    rows_per_t, tokens_per_t = h * w, h * w // (merge * merge)
    item.encoder_chunks, item.chunk_features = [], []
    for t0 in range(0, t, chunk_grid_t):
        t1 = min(t0 + chunk_grid_t, t)
        item.encoder_chunks.append((t0 * tokens_per_t, t1 * tokens_per_t))
        item.chunk_features.append((t0 * rows_per_t, t1 * rows_per_t, {"grid_thw": (t1 - t0, h, w)}))


class Qwen2_5_VLProcessor(BaseMultimodalProcessor):
    supported_modalities = ("image", "video")

    def __init__(self, hf_config, model_dir: str, server_args):
        text, vision = hf_config.text_config, hf_config.vision_config
        self.image_token_id = int(hf_config.image_token_id)
        self.video_token_id = int(hf_config.video_token_id)
        self.vision_start_id = int(hf_config.vision_start_token_id)
        self.vision_end_id = int(hf_config.vision_end_token_id)
        self.vocab_size = text.vocab_size
        self.max_position = text.max_position_embeddings
        self.merge = vision.spatial_merge_size
        self.tokens_per_second = float(getattr(vision, "tokens_per_second", 2))
        self.allowed_local_media_path = server_args.allowed_local_media_path
        self.item_limits = item_limits_of(server_args)
        self.image_cfg, self.video_cfg = load_pixel_configs(model_dir, server_args.max_image_pixels)
        self.max_video_frames = min(self.video_cfg.max_frames, server_args.max_video_frames)
        # the planned video chunk (the plan's encoder_video term is one chunk): the same function as the plan's
        tp = self.video_cfg.temporal_patch_size
        self.video_chunk_grid_t = video_chunk_frames(server_args.max_video_frames, tp) // tp
        if self.image_cfg.patch_size != vision.patch_size or self.image_cfg.merge_size != self.merge:
            raise ValueError(f"preprocessor_config.json (patch {self.image_cfg.patch_size}, merge "
                             f"{self.image_cfg.merge_size}) disagrees with the vision config (patch "
                             f"{vision.patch_size}, merge {self.merge}).")

    def chat_placeholder(self, modality: str, tokenizer) -> str:
        pad = {"image": self.image_token_id, "video": self.video_token_id}.get(modality)
        if pad is None:
            return None
        return "".join(tokenizer.convert_ids_to_tokens([self.vision_start_id, pad, self.vision_end_id]))

    # ---- the largest accepted inputs (the encoder's profile) ----
    def largest_grids(self) -> List[Tuple[int, int, int]]:
        return [largest_grid(self.image_cfg, self.image_cfg.temporal_patch_size),
                largest_grid(self.video_cfg, self.max_video_frames)]

    @property
    def max_pixel_values_shape(self) -> Tuple[int, int, int]:
        """The largest grid_thw any accepted image or video gives (what profile_encoder encodes)."""
        return max(self.largest_grids(), key=lambda g: g[0] * g[1] * g[2])

    @property
    def max_tokens_per_image(self) -> int:
        return num_tokens_of(self.max_pixel_values_shape, self.merge)

    # ---- one item ----
    def _image_item(self, data: Any) -> MultimodalDataItem:
        img = load_image(data, self.allowed_local_media_path)
        patches, grid = preprocess_frames([img], self.image_cfg, repeat_to_temporal_patch=True)
        return MultimodalDataItem(patches, content_hash(patches, f"image{grid}"), 0, num_tokens_of(grid, self.merge),
                                  img.size, "image", {"grid_thw": grid})

    def _video_item(self, data: Any) -> MultimodalDataItem:
        cfg = self.video_cfg
        video = load_video(data, self.allowed_local_media_path, cfg.fps, cfg.min_frames, self.max_video_frames,
                           cfg.temporal_patch_size, fit=lambda frame: resized_frame(frame, cfg))
        patches, grid = preprocess_frames(video.frames, cfg, repeat_to_temporal_patch=False)
        second_per_grid_t = cfg.temporal_patch_size / video.sampled_fps
        meta = {"grid_thw": grid, "second_per_grid_t": second_per_grid_t, "num_frames": len(video.frames)}
        item = MultimodalDataItem(patches, content_hash(patches, f"video{grid}{second_per_grid_t!r}"), 0,
                                  num_tokens_of(grid, self.merge), video.size, "video", meta)
        split_video_into_chunks(item, self.video_chunk_grid_t, self.merge)
        return item

    def _items(self, datas: list, make, name: str) -> List[MultimodalDataItem]:
        out = []
        for i, d in enumerate(datas):
            try:
                out.append(make(d))
            except ValueError as e:
                raise ValueError(f"{name} {i}: {e}" if len(datas) > 1 else str(e)) from e
        return out

    # ---- the request ----
    def process(self, input_ids: List[int], image_data: Any = None, video_data: Any = None,
                audio_data: Any = None) -> MultimodalInputs:
        images, videos = as_list(image_data), as_list(video_data)
        self.check_counts({"image": len(images), "video": len(videos), "audio": len(as_list(audio_data))})
        if not images and not videos:
            return MultimodalInputs(list(input_ids), [])
        queues = {self.image_token_id: self._items(images, self._image_item, "Image"),
                  self.video_token_id: self._items(videos, self._video_item, "Video")}
        ids = self._place(list(input_ids), len(images), len(videos))
        out: List[int] = []
        items: List[MultimodalDataItem] = []
        taken = {self.image_token_id: 0, self.video_token_id: 0}
        for t in ids:
            if t not in queues:
                out.append(t)
                continue
            item = queues[t][taken[t]]
            taken[t] += 1
            item.offset = len(out)
            items.append(item)
            out.extend(pad_ids(item.hash, item.num_tokens, self.vocab_size))
        positions, delta = mrope_positions(len(out), items, self.merge, self.tokens_per_second)
        if positions.numel() and int(positions.max()) >= self.max_position:
            raise ValueError(f"The request's multimodal positions reach {int(positions.max())}; the model has "
                             f"{self.max_position} (max_position_embeddings). Send shorter videos or fewer items.")
        return MultimodalInputs(out, items, positions, delta)

    def _place(self, ids: List[int], num_images: int, num_videos: int) -> List[int]:
        head: List[int] = []
        for token, n, name in ((self.image_token_id, num_images, "image"), (self.video_token_id, num_videos, "video")):
            count = sum(1 for t in ids if t == token)
            if count == 0 and n:
                head += [self.vision_start_id, token, self.vision_end_id] * n
            elif count != n:
                raise ValueError(f"The prompt has {count} {name} tokens but {n} {name}s were sent; "
                                 f"send one {name} per {name} token.")
        return head + ids

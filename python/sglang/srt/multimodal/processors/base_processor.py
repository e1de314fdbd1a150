"""BaseMultimodalProcessor: image/video data + prompt ids -> MultimodalInputs (runs in the main process, no model).

Image placement: each image token in the prompt takes the next image, in order. A prompt without image tokens
gets all its images at the start (after the BOS token, if the prompt starts with one). Any other mismatch between
image tokens and images is a ValueError. Per-request item counts are checked against --limit-mm-data-per-request
(and the hard cap below) before anything is decoded.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch

from sglang.srt.multimodal.image_loader import load_image
from sglang.srt.multimodal.mm_inputs import MultimodalDataItem, MultimodalInputs, content_hash, pad_ids

# A request may carry at most this many items of one modality (each costs encoder work and prompt tokens).
MAX_IMAGES_PER_REQUEST = 16


def as_list(data: Any) -> list:
    if data is None:
        return []
    return list(data) if isinstance(data, (list, tuple)) else [data]


def item_limits_of(server_args) -> Dict[str, int]:
    limits = getattr(server_args, "mm_item_limits", None)
    return limits() if callable(limits) else {}


class BaseMultimodalProcessor:
    image_token_id: int
    vocab_size: int
    bos_token_id: Optional[int] = None
    allowed_local_media_path: Optional[str] = None
    supported_modalities = ("image",)
    item_limits: Dict[str, int] = {}  # --limit-mm-data-per-request

    # ---- per model ----
    def preprocess(self, image) -> torch.Tensor:
        """RGB PIL image -> pixel_values for the encoder."""
        raise NotImplementedError

    def num_image_tokens(self, pixel_values: torch.Tensor) -> int:
        raise NotImplementedError

    @property
    def max_tokens_per_image(self) -> int:
        raise NotImplementedError

    def chat_placeholder(self, modality: str, tokenizer) -> Optional[str]:
        """The text the chat template puts where an item of `modality` goes (None: not accepted)."""
        return tokenizer.convert_ids_to_tokens(self.image_token_id) if modality == "image" else None

    # ---- shared ----
    def placeholder_ids(self) -> Dict[str, int]:
        """{modality: the prompt token each item of that modality takes} for the modalities this model accepts."""
        ids = {m: getattr(self, f"{m}_token_id", None) for m in self.supported_modalities}
        return {m: int(t) for m, t in ids.items() if t is not None and t >= 0}

    def unmatched_placeholders(self, input_ids: List[int], counts: Dict[str, int]) -> Dict[str, int]:
        """{modality: placeholder tokens in the prompt} for each modality that has such tokens but no items: the
        model would read those tokens' embeddings as if they were an item's (a mismatch with items sent is the
        processors' own 400)."""
        found = {}
        for modality, token in self.placeholder_ids().items():
            n = input_ids.count(token) if not counts.get(modality) else 0
            if n:
                found[modality] = n
        return found

    def check_counts(self, counts: Dict[str, int]) -> None:
        """Refuse modalities this model does not take, and more items than the limits allow (before decoding)."""
        for modality, n in counts.items():
            if not n:
                continue
            if modality not in self.supported_modalities:
                raise ValueError(f"This model does not accept {modality} inputs; it accepts "
                                 f"{', '.join(self.supported_modalities)}.")
            limit = self.item_limits.get(modality)
            if limit is not None and n > limit:
                raise ValueError(f"The request has {n} {modality} items; this server allows at most {limit} per "
                                 f"request (--limit-mm-data-per-request). Send at most {limit}.")
            if n > MAX_IMAGES_PER_REQUEST:
                raise ValueError(f"The request has {n} {modality}s; at most {MAX_IMAGES_PER_REQUEST} are accepted.")

    def process(self, input_ids: List[int], image_data: Any = None, video_data: Any = None,
                audio_data: Any = None) -> MultimodalInputs:
        images = as_list(image_data)
        self.check_counts({"image": len(images), "video": len(as_list(video_data)), "audio": len(as_list(audio_data))})
        if not images:
            return MultimodalInputs(list(input_ids), [])
        pixels = []
        for i, item in enumerate(images):
            try:
                img = load_image(item, self.allowed_local_media_path)
                pixels.append((self.preprocess(img), img.size))
            except ValueError as e:
                raise ValueError(f"Image {i}: {e}" if len(images) > 1 else str(e)) from e
        ids = self._place_image_tokens(list(input_ids), len(images))
        out: List[int] = []
        items: List[MultimodalDataItem] = []
        k = 0
        for t in ids:
            if t != self.image_token_id:
                out.append(t)
                continue
            pv, size = pixels[k]
            h = content_hash(pv)
            n = self.num_image_tokens(pv)
            items.append(MultimodalDataItem(feature=pv, hash=h, offset=len(out), num_tokens=n, image_size=size))
            out.extend(pad_ids(h, n, self.vocab_size))
            k += 1
        return MultimodalInputs(out, items)

    def _place_image_tokens(self, ids: List[int], num_images: int) -> List[int]:
        count = sum(1 for t in ids if t == self.image_token_id)
        if count == 0:
            at = 1 if (ids and self.bos_token_id is not None and ids[0] == self.bos_token_id) else 0
            return ids[:at] + [self.image_token_id] * num_images + ids[at:]
        if count != num_images:
            raise ValueError(f"The prompt has {count} image tokens but {num_images} images were sent; "
                             "send one image per image token.")
        return ids

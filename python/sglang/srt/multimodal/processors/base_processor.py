"""BaseMultimodalProcessor: image_data + prompt ids -> MultimodalInputs (runs in the main process, no model).

Image placement: each image token in the prompt takes the next image, in order. A prompt without image tokens
gets all its images at the start (after the BOS token, if the prompt starts with one). Any other mismatch between
image tokens and images is a ValueError.
"""

from __future__ import annotations

from typing import Any, List, Optional

import torch

from sglang.srt.multimodal.image_loader import load_image
from sglang.srt.multimodal.mm_inputs import MultimodalDataItem, MultimodalInputs, content_hash, pad_ids

# A request may carry at most this many images (each costs encoder work and prompt tokens).
MAX_IMAGES_PER_REQUEST = 16


class BaseMultimodalProcessor:
    image_token_id: int
    vocab_size: int
    bos_token_id: Optional[int] = None
    allowed_local_media_path: Optional[str] = None

    # ---- per model ----
    def preprocess(self, image) -> torch.Tensor:
        """RGB PIL image -> pixel_values for the encoder."""
        raise NotImplementedError

    def num_image_tokens(self, pixel_values: torch.Tensor) -> int:
        raise NotImplementedError

    @property
    def max_tokens_per_image(self) -> int:
        raise NotImplementedError

    # ---- shared ----
    def process(self, input_ids: List[int], image_data: Any) -> MultimodalInputs:
        images = image_data if isinstance(image_data, (list, tuple)) else [image_data]
        if not images:
            return MultimodalInputs(list(input_ids), [])
        if len(images) > MAX_IMAGES_PER_REQUEST:
            raise ValueError(f"The request has {len(images)} images; at most {MAX_IMAGES_PER_REQUEST} are accepted.")
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
            items.append(MultimodalDataItem(pixel_values=pv, hash=h, offset=len(out), num_tokens=n, image_size=size))
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

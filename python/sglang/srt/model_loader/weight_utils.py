"""Iterate (name, tensor) pairs over a directory's safetensors files (single file or sharded with an index)."""

from __future__ import annotations

import glob
import json
import os
from typing import Iterator, List, Tuple

import torch
from tqdm import tqdm

# Show a progress bar when the checkpoint is at least this large.
PROGRESS_BAR_MIN_BYTES = 1 << 30


def list_safetensors_files(model_dir: str) -> List[str]:
    index_file = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.isfile(index_file):
        with open(index_file) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        return [os.path.join(model_dir, s) for s in shards]
    files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"No *.safetensors files in {model_dir!r}.")
    return files


def safetensors_weights_iterator(model_dir: str) -> Iterator[Tuple[str, torch.Tensor]]:
    """Yield (hf_name, cpu tensor) for every tensor; tensors are memory-mapped, not copied."""
    from safetensors import safe_open

    files = list_safetensors_files(model_dir)
    total_bytes = sum(os.path.getsize(f) for f in files)
    bar = tqdm(
        total=total_bytes,
        desc="Loading safetensors",
        unit="B",
        unit_scale=True,
        disable=total_bytes < PROGRESS_BAR_MIN_BYTES,
        leave=False,
    )
    with bar:
        for file in files:
            with safe_open(file, framework="pt", device="cpu") as f:
                for name in f.keys():
                    tensor = f.get_tensor(name)
                    yield name, tensor
                    bar.update(tensor.numel() * tensor.element_size())

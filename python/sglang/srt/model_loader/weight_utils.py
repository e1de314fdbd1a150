"""Iterate (name, tensor) pairs over a directory's safetensors files (single file or sharded with an index).

With tp ranks each tensor comes as a CheckpointSlice, which reads from the file only the rows or columns a
parallel layer's weight_loader asks for (`narrow` / indexing): a rank reads its shard, never the whole tensor."""

from __future__ import annotations

import glob
import json
import os
from typing import Iterator, List, Tuple, Union

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


class CheckpointSlice:
    """A checkpoint tensor not read yet. `narrow(dim, start, length)` and `[index]` read only that part;
    `materialize()` reads it all (layers that keep a whole tensor on every rank: norms, biases of row-parallel
    layers)."""

    def __init__(self, safe_slice):
        self._slice = safe_slice
        self.shape = torch.Size(safe_slice.get_shape())

    def dim(self) -> int:
        return len(self.shape)

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor:
        index = [slice(None)] * len(self.shape)
        index[dim] = slice(start, start + length)
        return self._slice[tuple(index)]

    def __getitem__(self, index) -> torch.Tensor:
        return self._slice[index]

    def materialize(self) -> torch.Tensor:
        return self._slice[tuple(slice(None) for _ in self.shape)]


def materialize(tensor: Union[torch.Tensor, CheckpointSlice]) -> torch.Tensor:
    return tensor.materialize() if isinstance(tensor, CheckpointSlice) else tensor


def safetensors_weights_iterator(model_dir: str) -> Iterator[Tuple[str, Union[torch.Tensor, CheckpointSlice]]]:
    """Yield (hf_name, cpu tensor) for every tensor; tensors are memory-mapped, not copied. With tp ranks, yield
    (hf_name, CheckpointSlice) instead, so each rank reads only its shard."""
    from safetensors import safe_open

    from sglang.srt.distributed.parallel_state import get_tp_size

    lazy = get_tp_size() > 1

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
                    if lazy:
                        yield name, CheckpointSlice(f.get_slice(name))
                        continue
                    tensor = f.get_tensor(name)
                    yield name, tensor
                    bar.update(tensor.numel() * tensor.element_size())

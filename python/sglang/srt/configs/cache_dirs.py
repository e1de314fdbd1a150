"""Where this runtime keeps files between starts: converted GGUF models, the startup caches (resolved HF configs,
activation measurements). --model-cache-dir, else $SGLANG_CACHE_DIR, else ~/.cache/sglang."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from sglang.srt.server_args import ServerArgs


def cache_root(server_args: Optional["ServerArgs"] = None) -> str:
    root = (server_args.model_cache_dir if server_args is not None else None) or os.environ.get("SGLANG_CACHE_DIR")
    return root or os.path.join(os.path.expanduser("~"), ".cache", "sglang")


def startup_cache_dir(server_args: Optional["ServerArgs"] = None) -> str:
    """Where starts keep what later starts reuse (mem_plan/measurement_cache.py, configs/hf_config_snapshot.py)."""
    from sglang.srt.mem_plan.measurement_cache import startup_cache_dir as under_root

    return under_root(cache_root(server_args))

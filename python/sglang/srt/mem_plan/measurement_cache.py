"""A startup measurement kept on disk, so that later starts with the same inputs reuse it instead of measuring again.

The CPU activation peak (one profile forward at the chunked-prefill size, measure.measure_peak) is the slowest step
of a CPU start: about 3 s of a 10 s start for the default model on 2 cores. It depends only on what runs that
forward, so a start stores it under a key naming every such input (the caller builds the key:
model_executor/activation_cache.py) and a later start with an identical key reads it back:

    <cache root>/startup-cache/<name>-<sha256(key)[:16]>.json   {"key": {...}, "value_bytes": N, ...}

A stored value is used only when the file's key equals the start's key field for field (a digest collision or a
hand-edited file is measured again); any changed input names another file, so it is measured again and stored
there. The plan says which it was (model_runner_kv_cache_mixin.py adds a note with the file's path).
SGLANG_REMEASURE_ACTIVATIONS=1 measures again and overwrites the file; SGLANG_STARTUP_CACHE_DIR moves the
directory (default: <--model-cache-dir or SGLANG_CACHE_DIR or ~/.cache/sglang>/startup-cache), which also holds the
config snapshots of configs/hf_config_snapshot.py.
A file that cannot be written only costs the next start a measurement. Torch-free.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Callable, Optional

logger = logging.getLogger(__name__)

CACHE_FORMAT_VERSION = 1
CACHE_SUBDIR = "startup-cache"
REMEASURE_ENV = "SGLANG_REMEASURE_ACTIVATIONS"  # "1": measure again and overwrite the stored value
CACHE_DIR_ENV = "SGLANG_STARTUP_CACHE_DIR"


@dataclass(frozen=True)
class Measurement:
    value_bytes: int
    path: str  # the cache file (read from it, or written to it)
    cached: bool  # True: read from path; False: measured by this start

    @property
    def source(self) -> str:
        return f"measured (cached {self.path})" if self.cached else "measured"


def startup_cache_dir(cache_root: str) -> str:
    return os.environ.get(CACHE_DIR_ENV) or os.path.join(cache_root, CACHE_SUBDIR)


def key_digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def cache_file(cache_dir: str, name: str, key: dict) -> str:
    return os.path.join(cache_dir, f"{name}-{key_digest(key)}.json")


def read_cached(path: str, key: dict) -> Optional[int]:
    """The stored value when `path` holds one for exactly this key, else None."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT_VERSION or data.get("key") != key:
        return None
    value = data.get("value_bytes")
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def write_cached(path: str, key: dict, value_bytes: int) -> None:
    data = {"format": CACHE_FORMAT_VERSION, "key": key, "value_bytes": int(value_bytes),
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    write_json_atomic(path, data, "startup measurement")


def write_json_atomic(path: str, data: dict, what: str) -> None:
    """Store atomically (temporary file + rename: concurrent starts never read a torn file)."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError as e:
        logger.warning("Could not store the %s in %s (%s); the next start computes it again.", what, path, e)


def cached_measurement(cache_dir: str, name: str, key: dict, measure: Callable[[], int]) -> Measurement:
    """The value stored for `key` under `name`, else measure() (then stored)."""
    path = cache_file(cache_dir, name, key)
    if os.environ.get(REMEASURE_ENV, "0") != "1":
        value = read_cached(path, key)
        if value is not None:
            return Measurement(value, path, True)
    value = int(measure())
    write_cached(path, key, value)
    return Measurement(value, path, False)

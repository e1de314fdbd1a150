"""Loading the main process's tokenizer, and the model name the API reports."""

from __future__ import annotations

import logging
import os
from typing import Optional

from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)


def served_model_name(server_args: ServerArgs, resolved_model_path: str) -> str:
    """The API's model id: --served-model-name, else the name of --model-path, else the default model's name."""
    if server_args.served_model_name:
        return server_args.served_model_name
    path = server_args.model_path
    if path is None:
        from sglang.srt.model_loader.model_path import DEFAULT_MODEL_FILE

        path = DEFAULT_MODEL_FILE
    name = os.path.basename(os.path.normpath(path))
    for suffix in (".gguf",):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name


def preload_tokenizer(server_args: ServerArgs) -> Optional[tuple]:
    """(path, tokenizer) if the tokenizer's directory already exists (no GGUF conversion pending), else None.

    Called while the scheduler process loads the model, so the ~seconds of importing transformers and reading the
    tokenizer overlap with it instead of following it.
    """
    if server_args.skip_tokenizer_init:
        return None
    from sglang.srt.configs.cache_dirs import cache_root, startup_cache_dir
    from sglang.srt.model_loader.model_path import default_model_path, gguf_cache_dir

    try:
        path = server_args.tokenizer_path or server_args.model_path or default_model_path()
        if os.path.isfile(path) and path.endswith(".gguf"):
            path = gguf_cache_dir(path, cache_root(server_args))
        if not os.path.isdir(path):
            return None
        from sglang.srt.utils.hf_transformers_utils import get_tokenizer

        return path, get_tokenizer(path, startup_cache_dir(server_args))
    except Exception as e:  # the scheduler reports real problems; this is only a head start
        logger.debug("Tokenizer preload skipped: %s", e)
        return None

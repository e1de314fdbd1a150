"""Loading the main process's tokenizer, and the model name the API reports."""

from __future__ import annotations

import logging
import os
import time
from typing import Callable, Optional

from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)


def served_model_name(server_args: ServerArgs, resolved_model_path: str) -> str:
    """The API's model id, as upstream's: --served-model-name, else --model-path exactly as given (a hub id, a
    directory or a .gguf path, unresolved). Without --model-path, the bundled model's file name without .gguf
    ("SmolLM2-135M-Instruct.Q4_1": the weights and their quantization)."""
    if server_args.served_model_name:
        return server_args.served_model_name
    if server_args.model_path:
        return server_args.model_path
    from sglang.srt.model_loader.model_path import DEFAULT_MODEL_FILE

    return DEFAULT_MODEL_FILE[: -len(".gguf")]


# how long the main process waits for a first start's GGUF conversion to write the tokenizer before it leaves the
# tokenizer to TokenizerManager (which loads it after the scheduler is ready)
CONVERSION_WAIT_S = 120.0
CONVERSION_POLL_S = 0.05


def preload_tokenizer(server_args: ServerArgs, scheduler_alive: Callable[[], bool] = lambda: True,
                      wait_s: float = CONVERSION_WAIT_S) -> Optional[tuple]:
    """(path, tokenizer), else None (the scheduler died, or a conversion outlasted wait_s).

    Called while the scheduler process loads the model, so the ~seconds of importing transformers and reading the
    tokenizer overlap with it instead of following it. On a GGUF's first start the scheduler converts the file: this
    waits (while scheduler_alive()) for the converted directory, which is renamed into place whole.
    """
    if server_args.skip_tokenizer_init:
        return None
    from sglang.srt.configs.cache_dirs import cache_root, startup_cache_dir
    from sglang.srt.model_loader.model_path import default_model_path, gguf_cache_dir

    try:
        path = server_args.tokenizer_path or server_args.model_path or default_model_path()
        converted = os.path.isfile(path) and path.endswith(".gguf")
        if converted:
            path = gguf_cache_dir(path, cache_root(server_args))
        from sglang.srt.utils.hf_transformers_utils import get_tokenizer  # imported while a conversion runs

        deadline = time.monotonic() + wait_s
        while converted and not os.path.isdir(path) and scheduler_alive() and time.monotonic() < deadline:
            time.sleep(CONVERSION_POLL_S)
        if not os.path.isdir(path):
            return None
        return path, get_tokenizer(path, startup_cache_dir(server_args))
    except Exception as e:  # the scheduler reports real problems; this is only a head start
        logger.debug("Tokenizer preload skipped: %s", e)
        return None

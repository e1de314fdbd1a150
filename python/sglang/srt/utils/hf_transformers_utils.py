"""Tokenizer helpers on top of Hugging Face transformers (fast tokenizers only)."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional


def get_tokenizer(tokenizer_path: str, startup_cache_dir: Optional[str] = None, **kwargs):
    """A fast (Rust) tokenizer from a local directory. startup_cache_dir: AutoTokenizer gets the directory's config
    snapshot where that cannot change its choice (configs/hf_config_snapshot.py), instead of resolving it again."""
    from transformers import AutoTokenizer

    if tokenizer_path.endswith(".gguf") and os.path.isfile(tokenizer_path):
        # a GGUF file (upstream tests pass the model path): the tokenizer stored in its metadata, as transformers reads it
        folder, name = os.path.split(os.path.abspath(tokenizer_path))
        return AutoTokenizer.from_pretrained(folder, gguf_file=name, use_fast=True, **kwargs)
    if "config" not in kwargs:
        from sglang.srt.configs.hf_config_snapshot import tokenizer_kwargs

        kwargs.update(tokenizer_kwargs(tokenizer_path, startup_cache_dir))
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path, use_fast=True, trust_remote_code=False, **kwargs)
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"{tokenizer_path!r} has no fast tokenizer (tokenizer.json); only fast tokenizers are supported.")
    return tokenizer


def apply_chat_template(
    tokenizer,
    messages: List[Dict[str, Any]],
    add_generation_prompt: bool = True,
    tokenize: bool = False,
    chat_template: Optional[str] = None,
    **kwargs,
):
    """Render `messages` with the tokenizer's chat template; returns text, or token ids when tokenize=True."""
    if chat_template is None and not getattr(tokenizer, "chat_template", None):
        raise ValueError("This tokenizer has no chat template; pass chat_template=... or send a plain prompt.")
    text = tokenizer.apply_chat_template(
        messages, chat_template=chat_template, add_generation_prompt=add_generation_prompt, tokenize=False, **kwargs
    )
    if not tokenize:
        return text
    # the template already spells out every special token (BOS included)
    return tokenizer.encode(text, add_special_tokens=False)

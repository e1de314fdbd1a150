"""A SentencePiece-BPE vocabulary stored in a GGUF file (`tokenizer.ggml.model` == "llama": Gemma) as a `tokenizers`
BPE tokenizer.json, producing the ids SentencePiece does.

SentencePiece BPE keeps no merge list: a piece's score is its merge priority (higher merges first; Gemma's normal
pieces score 0, -1, -2, ... by rank). The merge list is therefore every split of a normal piece into two normal pieces,
ordered by the merged piece's score, the splits of one piece by (left id, right id). Text is normalised by replacing
spaces with U+2581 and is not split further (no whitespace pre-split: a piece may span words); characters with no
piece fall back to their UTF-8 byte tokens (<0x..>). Control tokens are special added tokens; user-defined ones
(Gemma: runs of newlines and tabs, <start_of_turn>, image markers) are added tokens matched whole, not special, so
decoding with skip_special_tokens keeps newlines.
"""

from __future__ import annotations

import json
import os
from typing import Dict, List, Tuple

# GGUF token types (llama.cpp's llama_token_type)
NORMAL, CONTROL, USER_DEFINED, BYTE = 1, 3, 4, 6
SPACE = "\u2581"


def spm_merges(tokens: List[str], scores: List[float], types: List[int]) -> List[Tuple[str, str]]:
    """The BPE merges equivalent to SentencePiece's score-driven merging (module docstring)."""
    normal: Dict[str, int] = {t: i for i, (t, ty) in enumerate(zip(tokens, types)) if ty == NORMAL}
    ranked = []
    for piece, pid in normal.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            lid, rid = normal.get(left), normal.get(right)
            if lid is not None and rid is not None:
                ranked.append((-scores[pid], lid, rid, left, right))
    ranked.sort(key=lambda r: r[:3])
    return [(r[3], r[4]) for r in ranked]


def build_spm_tokenizer_files(meta, out_dir: str) -> None:
    """Write tokenizer.json + tokenizer_config.json for a GGUF SentencePiece-BPE vocabulary (meta: GGUFMetadata)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors

    tokens: List[str] = meta.get("tokenizer.ggml.tokens")
    scores: List[float] = meta.get("tokenizer.ggml.scores")
    types: List[int] = meta.get("tokenizer.ggml.token_type")
    if scores is None or types is None:
        raise ValueError("GGUF SentencePiece vocabulary without tokenizer.ggml.scores / token_type")
    if meta.get("tokenizer.ggml.add_space_prefix", False):
        raise ValueError("GGUF SentencePiece vocabulary with add_space_prefix is not supported; pass --tokenizer-path")
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    vocab = {t: i for i, t in enumerate(tokens)}
    model = models.BPE(vocab=vocab, merges=spm_merges(tokens, scores, types), fuse_unk=True, byte_fallback=True,
                       unk_token=tokens[unk_id] if unk_id is not None else None)
    tok = Tokenizer(model)
    tok.normalizer = normalizers.Replace(" ", SPACE)
    tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t, ty in zip(tokens, types) if ty == USER_DEFINED])

    def token_of(key: str):
        idx = meta.get(key)
        return tokens[idx] if idx is not None and 0 <= idx < len(tokens) else None

    bos, eos = token_of("tokenizer.ggml.bos_token_id"), token_of("tokenizer.ggml.eos_token_id")
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False)) and bos is not None
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False)) and eos is not None
    single = ([f"{bos}:0"] if add_bos else []) + ["$A:0"] + ([f"{eos}:0"] if add_eos else [])
    special = [(t, vocab[t]) for t, on in ((bos, add_bos), (eos, add_eos)) if on]
    if special:
        tok.post_processor = processors.TemplateProcessing(single=single, special_tokens=special)
    tok.save(os.path.join(out_dir, "tokenizer.json"))

    write_tokenizer_config(meta, tokens, out_dir, add_bos, add_eos)


def write_tokenizer_config(meta, tokens: List[str], out_dir: str, add_bos: bool, add_eos: bool) -> None:
    """tokenizer_config.json of a converted GGUF vocabulary (either tokenizer model): its special tokens by the
    header's ids, the BOS / EOS rule, the context length and the file's chat template when it has one."""

    def token_of(key: str):
        idx = meta.get(key)
        return tokens[idx] if idx is not None and 0 <= idx < len(tokens) else None

    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token_of("tokenizer.ggml.bos_token_id"),
        "eos_token": token_of("tokenizer.ggml.eos_token_id"),
        "unk_token": token_of("tokenizer.ggml.unknown_token_id"),
        "pad_token": token_of("tokenizer.ggml.padding_token_id"),
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(meta.arch_get("context_length", 2048)),
    }
    template = meta.get("tokenizer.chat_template")
    if template:
        tokenizer_config["chat_template"] = template
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config, f, indent=2, ensure_ascii=False)

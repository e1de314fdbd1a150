"""The tests' reference for what a grammar's language holds: xgrammar's own matcher over a vocabulary of the 256
single bytes and one stop token (every output is some byte string, so the answer holds for every tokenizer)."""

import pytest
import torch

xgr = pytest.importorskip("xgrammar")

STOP = 256


def byte_compiler():
    info = xgr.TokenizerInfo([bytes([b]) for b in range(256)] + [b"</s>"], xgr.VocabType.RAW, stop_token_ids=[STOP])
    return xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)


def compile_kind(compiler, kind, text):
    if kind == "json_schema":
        return compiler.compile_json_schema(text, any_whitespace=False)
    return compiler.compile_regex(text) if kind == "regex" else compiler.compile_grammar(text)


def allowed_bytes(matcher):
    """The byte tokens (and STOP) the matcher allows next."""
    row = torch.zeros((1, 9), dtype=torch.int32)
    matcher.fill_next_token_bitmask(row, 0)
    bits = (row[0].unsqueeze(1) >> torch.arange(32, dtype=torch.int32)) & 1
    return torch.nonzero(bits.reshape(-1)[:257]).flatten().tolist()


def end_reachable(compiled, max_nodes):
    """Depth-first over every byte prefix the matcher accepts: True when some prefix may end (STOP allowed), False
    when the whole (finite) tree was searched without one, None past max_nodes prefixes."""
    stack, nodes = [b""], 0
    while stack:
        prefix = stack.pop()
        nodes += 1
        if nodes > max_nodes:
            return None
        m = xgr.GrammarMatcher(compiled)
        assert all(m.accept_token(b) for b in prefix)
        allowed = allowed_bytes(m)
        if STOP in allowed:
            return True
        stack.extend(prefix + bytes([b]) for b in allowed)
    return False

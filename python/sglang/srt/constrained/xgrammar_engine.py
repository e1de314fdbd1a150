"""XGrammarEngine: --grammar-backend xgrammar behind the interface every grammar engine has (backend_table.py).

    check(kind, text)      the edge: xgrammar's parser only (no vocabulary work); raises on a bad grammar
    Engine(tok, V, stops)  on the compile thread: the tokenizer scan (~0.3 s), once
    compile(kind, text)    against the vocabulary; the result has memory_size_bytes (the cache's budget unit)
    matcher(compiled)      one request's matcher: fill_next_token_bitmask(bitmask, row), accept_token(id) -> bool,
                           is_terminated() (its stop token accepted)

JSON schemas compile in the compact layout (", " and ": ", no other whitespace): a small model left free to write
blanks can spend its whole budget on them.
"""

from __future__ import annotations

from typing import Any, Sequence


class XGrammarEngine:
    name = "xgrammar"
    package = "xgrammar"

    @staticmethod
    def check(kind: str, text: str) -> Any:
        import xgrammar as xgr

        if kind == "json_schema":
            return xgr.Grammar.from_json_schema(text)
        if kind == "regex":
            return xgr.Grammar.from_regex(text)
        if kind == "ebnf":
            return xgr.Grammar.from_ebnf(text)
        raise ValueError(f"unknown grammar kind {kind!r}")

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int]):
        import xgrammar as xgr

        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                  stop_token_ids=list(stop_token_ids))
        # our GrammarCache is the cache (one budget, one eviction rule); xgrammar's own stays off
        self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    def compile(self, kind: str, text: str) -> Any:
        if kind == "json_schema":
            return self._compiler.compile_json_schema(text, any_whitespace=False)
        if kind == "regex":
            return self._compiler.compile_regex(text)
        if kind == "ebnf":
            return self._compiler.compile_grammar(text)
        raise ValueError(f"unknown grammar kind {kind!r}")

    @staticmethod
    def matcher(compiled: Any) -> Any:
        import xgrammar as xgr

        return xgr.GrammarMatcher(compiled)

"""The --grammar-backend names: the one table ServerArgs' choices come from (server_args.GRAMMAR_BACKEND_CHOICES).

    xgrammar    json_schema / regex / ebnf (xgrammar's EBNF) / response_format / tool_choice grammars (default)
    llguidance  the same requests; ebnf may also be a Lark grammar (llguidance_engine.py)
    outlines    upstream's third backend: refused at launch (OUTLINES_REFUSAL says why)
    none        constrained decoding off: requests with a grammar get a 400

grammar_backend_refusal(name) is the launch check: None when the backend can run here, else the message.
"""

from __future__ import annotations

import importlib.util
from typing import Dict, Optional, Type

NO_BACKEND = "none"
OUTLINES_REFUSAL = (
    "--grammar-backend outlines is not supported: this server masks tokens with one packed bitmask per request "
    "(filled on a worker thread while the forward runs), which outlines does not produce, and its dependencies "
    "(outlines-core, a pinned transformers) are not installed. Use --grammar-backend xgrammar (the default) or "
    "--grammar-backend llguidance: both take json_schema, regex, ebnf and response_format.")

# name -> "module:class" of the engine (constrained/*_engine.py), imported only when that backend is used
_ENGINES: Dict[str, Optional[str]] = {
    "xgrammar": "sglang.srt.constrained.xgrammar_engine:XGrammarEngine",
    "llguidance": "sglang.srt.constrained.llguidance_engine:LLGuidanceEngine",
    "outlines": None,
    NO_BACKEND: None,
}
GRAMMAR_BACKENDS = tuple(_ENGINES)
WORKING_BACKENDS = tuple(name for name, engine in _ENGINES.items() if engine is not None)
GRAMMAR_BACKEND_HELP = (
    "Backend for json_schema / regex / ebnf / response_format constraints and tool_choice 'required' / named "
    "functions: 'xgrammar', or 'llguidance' (the same requests; ebnf may also be written in Lark). 'none' refuses "
    "them. 'outlines' (upstream's third) is refused at launch: it does not produce the packed token bitmask this "
    "server masks with; use xgrammar or llguidance.")


def grammar_backend_refusal(name: str) -> Optional[str]:
    """Why --grammar-backend `name` cannot run here (unknown, refused, its package missing), or None."""
    if name == NO_BACKEND:
        return None
    if name == "outlines":
        return OUTLINES_REFUSAL
    if _ENGINES.get(name) is None:
        return f"--grammar-backend {name!r} is unknown; choose one of {', '.join(GRAMMAR_BACKENDS)}."
    if importlib.util.find_spec(name) is None:
        return (f"--grammar-backend {name} needs the {name} package, which is not installed: install the runtime "
                "with `bash scripts/install.sh` or `pip install -e \"python[cpu]\"` (\"python[cuda]\" on NVIDIA), or "
                "start with --grammar-backend none.")
    return None


def engine_class(name: str) -> Type:
    """The engine of a working backend (xgrammar_engine.XGrammarEngine, llguidance_engine.LLGuidanceEngine)."""
    refusal = grammar_backend_refusal(name)
    if refusal is not None or name == NO_BACKEND:
        raise ValueError(refusal or "--grammar-backend none has no engine")
    module, _, cls = _ENGINES[name].partition(":")
    return getattr(importlib.import_module(module), cls)

"""What a chat request's `tools` and `tool_choice` mean for this server: which tools the chat template sees, how the
output is parsed, and which grammar (if any) forces a call.

    tool_choice         template sees   output parsed by --tool-call-parser   grammar
    none                no tools        no                                    none
    auto (default)      the tools       if a parser is configured             none
    required            the tools       yes (parser required)                 one or more calls to offered functions
    {"function": f}     the tools       yes (parser required)                 exactly one call to f

Everything a client can get wrong is a 400 naming the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Collection, Dict, FrozenSet, List, Optional, Tuple

from sglang.srt.function_call.base_format_detector import BaseFormatDetector
from sglang.srt.function_call.detectors import TOOL_CALL_PARSERS, make_detector
from sglang.srt.function_call.grammar import tool_call_ebnf
from sglang.srt.function_call.grammar_lark import tool_call_lark
from sglang.srt.function_call.tool_types import NamedToolChoice, Tool
from sglang.srt.managers.request_error import RequestError


@dataclass(frozen=True)
class ToolPlan:
    template_tools: Optional[List[Dict[str, Any]]]  # for the chat template; None: no tools
    detector: Optional[BaseFormatDetector]  # None: the output is not parsed for calls
    function_names: FrozenSet[str] = frozenset()
    forced: bool = False  # a grammar makes the whole output a tool-call section
    ebnf: Optional[str] = None  # that grammar (xgrammar's EBNF, or Lark for llguidance)


NO_TOOLS = ToolPlan(template_tools=None, detector=None)


def plan_tools(
    tools: Optional[List[Tool]],
    tool_choice: Any,
    parallel_tool_calls: Optional[bool],
    parser_name: Optional[str],
    special_tokens: Collection[str] = (),
    grammar_backend: Optional[str] = None,
) -> ToolPlan:
    """grammar_backend: the server's --grammar-backend ("none": required/named choices cannot be enforced)."""
    named = tool_choice.function.name if isinstance(tool_choice, NamedToolChoice) else None
    if not tools:
        if named is not None or tool_choice == "required":
            raise RequestError(400, "tool_choice requires `tools`: offer the functions the model may call.",
                               param="tool_choice")
        return NO_TOOLS
    seen: Dict[str, int] = {}
    for i, tool in enumerate(tools):
        if tool.function.name in seen:
            raise RequestError(400, f"tools[{i}] repeats the function name {tool.function.name!r} of "
                               f"tools[{seen[tool.function.name]}]; function names must be unique.",
                               param=f"tools[{i}].function.name")
        seen[tool.function.name] = i
    if tool_choice == "none":
        return NO_TOOLS
    template_tools = [t.model_dump(exclude_none=True) for t in tools]
    detector = make_detector(parser_name) if parser_name else None
    if tool_choice in (None, "auto"):
        return ToolPlan(template_tools, detector, frozenset(seen))
    choice_desc = "tool_choice='required'" if named is None else "a named tool_choice"
    if detector is None:
        raise RequestError(
            400, f"{choice_desc} needs a tool-call parser to read the call: start the server with "
            f"--tool-call-parser (one of {', '.join(TOOL_CALL_PARSERS)}), or use tool_choice 'auto' or 'none'.",
            param="tool_choice")
    if not detector.supports_grammar:
        raise RequestError(
            400, f"{choice_desc} is enforced with a grammar, and the server's --tool-call-parser {detector.name} "
            "format cannot be (its arguments are Python keyword arguments, and grammars constrain JSON). Use "
            "tool_choice 'auto' (the parser still reads the calls), or a server with a JSON-format parser.",
            param="tool_choice")
    if grammar_backend == "none":
        raise RequestError(
            400, f"{choice_desc} is enforced with a grammar, and this server runs with --grammar-backend none. "
            "Use tool_choice 'auto', or restart the server with a grammar backend.", param="tool_choice")
    if named is not None and named not in seen:
        raise RequestError(
            400, f"Tool {named!r} not found in tools list: tool_choice names a function that is not among the "
            f"request's tools ({', '.join(sorted(seen))}).", param="tool_choice.function.name")
    if named is None:
        check_shared_defs(tools)
    functions: List[Tuple[int, str, Optional[dict]]] = [
        (i, t.function.name, t.function.parameters) for i, t in enumerate(tools)
        if named is None or t.function.name == named
    ]
    one_call = named is not None or parallel_tool_calls is False
    write_marker = bool(detector.grammar_start) and not {detector.start, detector.end} & set(special_tokens)
    build = tool_call_lark if grammar_backend == "llguidance" else tool_call_ebnf  # each engine's own grammar text
    ebnf = build(detector, functions, one_call, write_marker)
    names = frozenset(name for _, name, _ in functions)
    return ToolPlan(template_tools, detector, names, forced=True, ebnf=ebnf)


def check_shared_defs(tools: List[Tool]) -> None:
    """tool_choice='required': upstream builds one schema over all the tools, their `$defs` merged into one, and
    answers 400 when two tools define the same name differently. This server compiles each tool's schema on its
    own, but refuses the same requests so that a client written against either server gets one answer."""
    first: Dict[str, Tuple[int, Any]] = {}  # $defs name -> (tool index, schema)
    for i, tool in enumerate(tools):
        defs = (tool.function.parameters or {}).get("$defs")
        for name, schema in (defs.items() if isinstance(defs, dict) else ()):
            if name in first and first[name][1] != schema:
                j = first[name][0]
                raise RequestError(
                    400, f"tools[{j}] ({tools[j].function.name!r}) and tools[{i}] ({tool.function.name!r}) both "
                    f"define $defs {name!r}, with different schemas; with tool_choice='required' the tools' $defs "
                    "share one namespace (as upstream): rename one of them, or make the two schemas identical.",
                    param=f"tools[{i}].function.parameters.$defs.{name}")
            first.setdefault(name, (i, schema))


def template_tool_calls(tool_calls: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """An assistant message's tool_calls as chat templates expect them: OpenAI sends `arguments` as a JSON string,
    the templates (Qwen, Llama, Mistral) render it as an object."""
    out = []
    for call in tool_calls:
        fn = call.get("function")
        if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
            try:
                call = {**call, "function": {**fn, "arguments": json.loads(fn["arguments"])}}
            except ValueError:
                pass  # not JSON: the template gets the string as sent
        out.append(call)
    return out

"""The tool_choice "required" / named-function grammar for --grammar-backend llguidance, in llguidance's Lark: the
same language as grammar.py's xgrammar structural tag (the section in the parser's own format, only the allowed
functions, their arguments matching their `parameters` schema in the compact JSON layout), with each arguments
object an inline `%json {schema}` rule. For Qwen 2.5 and one function:

    start: calls
    calls: call
    call: call_0
    call_0: "<tool_call>\\n{\\"name\\": \\"get_weather\\", \\"arguments\\": " args_0 "}\\n</tool_call>"
    args_0: %json {"type": "object", ..., "x-guidance": {"whitespace_flexible": false, ...}}

The request carries it as its `ebnf` grammar text; llguidance reads Lark there (llguidance_engine.py).
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Tuple

from sglang.srt.function_call.base_format_detector import BaseFormatDetector
from sglang.srt.function_call.grammar_errors import clean_grammar_error
from sglang.srt.managers.request_error import RequestError

# the JSON layout xgrammar's path writes (", " and ": ", no free whitespace), as llguidance's JSON options; the
# llguidance engine compiles response_format schemas with it too (constrained/llguidance_engine.py)
LLGUIDANCE_COMPACT_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
EMPTY_PARAMETERS = {"type": "object", "properties": {}}
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "allOf", "oneOf", "prefixItems")
_SCHEMA_ONE = ("items", "additionalProperties", "not", "contains", "if", "then", "else", "unevaluatedProperties")


def closed_objects(schema: Any) -> Any:
    """The schema with `additionalProperties: false` wherever an object schema leaves it (and
    unevaluatedProperties) unset: xgrammar's strict mode, the default of its JSON path, so that llguidance allows
    the same objects (the declared properties only) rather than JSON Schema's open default."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: closed_objects(v) for k, v in out[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed_objects(v) for v in out[key]]
    for key in _SCHEMA_ONE:
        if isinstance(out.get(key), dict):
            out[key] = closed_objects(out[key])
    is_object = out.get("type") == "object" or (isinstance(out.get("type"), list) and "object" in out["type"]) \
        or "properties" in out
    if is_object and "additionalProperties" not in out and "unevaluatedProperties" not in out:
        out["additionalProperties"] = False
    return out


def _literal(text: str) -> str:
    return json.dumps(text)  # a Lark string literal: JSON's escapes (\n, \", \\, \uXXXX) are Lark's


def arguments_json_rule(index: int, name: str, parameters: Optional[Dict[str, Any]]) -> str:
    """`%json {...}` for one function's arguments; a schema llguidance cannot use is a 400 naming the function."""
    from llguidance import LLMatcher

    schema = closed_objects(parameters if parameters is not None else EMPTY_PARAMETERS)
    schema["x-guidance"] = {**LLGUIDANCE_COMPACT_JSON, **(schema.get("x-guidance") or {})}
    try:
        error = LLMatcher.validate_grammar(LLMatcher.grammar_from_json_schema(json.dumps(schema)))
    except (ValueError, TypeError) as e:
        error = str(e)
    if error:
        raise RequestError(
            400, f"Function {name!r} has an invalid 'parameters' schema: it cannot constrain the tool call: "
            f"{clean_grammar_error(error)}", param=f"tools[{index}].function.parameters")
    return "%json " + json.dumps(schema)


def tool_call_lark(
    detector: BaseFormatDetector,
    functions: List[Tuple[int, str, Optional[Dict[str, Any]]]],
    one_call: bool,
    write_start_marker: bool,
) -> str:
    """Arguments as grammar.tool_call_structural_tag's."""
    lines = []
    head, tail = detector.grammar_head(write_start_marker), detector.grammar_tail(write_start_marker)
    lines.append("start: " + " ".join(p for p in (_literal(head) if head else "", "calls",
                                                   _literal(tail) if tail else "") if p))
    sep = _literal(detector.grammar_separator)
    lines.append("calls: call" if one_call else f"calls: call ({sep} call)*")
    lines.append("call: " + " | ".join(f"call_{k}" for k in range(len(functions))))
    for k, (index, name, params) in enumerate(functions):
        begin, end = detector.grammar_call_begin(name), detector.grammar_call_end()
        lines.append(f"call_{k}: {_literal(begin)} args_{k} {_literal(end)}")
        lines.append(f"args_{k}: {arguments_json_rule(index, name, params)}")
    return "\n".join(lines) + "\n"

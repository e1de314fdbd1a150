"""The grammar that makes tool_choice="required" or a named function hold: the output is a tool-call section in the
parser's own format, calling only the allowed functions with arguments that match their `parameters` schema.

It is built as an xgrammar structural tag (a sequence of literals and per-function tags whose content is the
function's JSON schema) and handed to the request as EBNF text (sampling param `ebnf`), so it travels and compiles
like any other grammar. The calls are written in the compact form the detector parses: for Qwen 2.5

    <tool_call>\\n{"name": "get_weather", "arguments": {"city": "Paris"}}\\n</tool_call>
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Tuple

from sglang.srt.function_call.base_format_detector import BaseFormatDetector
from sglang.srt.function_call.grammar_errors import clean_grammar_error
from sglang.srt.managers.request_error import RequestError

EMPTY_PARAMETERS = {"type": "object", "properties": {}}


def arguments_ebnf(index: int, name: str, parameters: Optional[Dict[str, Any]]) -> str:
    """The arguments object of one function as EBNF: its JSON schema in the compact layout (", " and ": ", no
    other whitespace -- a small model left free to add blanks can spend its whole budget on them). A schema
    xgrammar cannot use is a 400 naming the function."""
    import xgrammar

    try:
        schema = json.dumps(parameters if parameters is not None else EMPTY_PARAMETERS)
        return str(xgrammar.Grammar.from_json_schema(schema, any_whitespace=False))
    except Exception as e:  # noqa: BLE001 -- xgrammar raises several types; all mean "bad schema"
        raise RequestError(
            400, f"Function {name!r} has an invalid 'parameters' schema: it cannot constrain the tool call: "
            f"{clean_grammar_error(e)}",
            param=f"tools[{index}].function.parameters",
        ) from None


def tool_call_structural_tag(
    detector: BaseFormatDetector,
    functions: List[Tuple[int, str, Optional[Dict[str, Any]]]],
    one_call: bool,
    write_start_marker: bool,
) -> dict:
    """functions: (index in `tools`, name, parameters schema) of the callable functions. one_call: exactly one call
    (a named tool_choice, or parallel_tool_calls=false); otherwise one or more. write_start_marker: the section's
    start marker is ordinary text for this tokenizer (a special token cannot be matched by a grammar; the parser
    then reads the section without it)."""
    tags = [{
        "type": "tag",
        "begin": detector.grammar_call_begin(name),
        "content": {"type": "grammar", "grammar": arguments_ebnf(index, name, params)},
        "end": detector.grammar_call_end(),
    } for index, name, params in functions]
    calls = {
        "type": "tags_with_separator",
        "tags": tags,
        "separator": detector.grammar_separator,
        "at_least_one": True,
        "stop_after_first": one_call,
    }
    head, tail = detector.grammar_head(write_start_marker), detector.grammar_tail(write_start_marker)
    elements = [{"type": "const_string", "value": head}] if head else []
    elements.append(calls)
    if tail:
        elements.append({"type": "const_string", "value": tail})
    fmt = elements[0] if len(elements) == 1 else {"type": "sequence", "elements": elements}
    return {"type": "structural_tag", "format": fmt}


def tool_call_ebnf(
    detector: BaseFormatDetector,
    functions: List[Tuple[int, str, Optional[Dict[str, Any]]]],
    one_call: bool,
    write_start_marker: bool,
) -> str:
    """EBNF text of tool_call_structural_tag (what the request's `ebnf` sampling param carries)."""
    import xgrammar

    tag = tool_call_structural_tag(detector, functions, one_call, write_start_marker)
    try:
        return str(xgrammar.Grammar.from_structural_tag(json.dumps(tag)))
    except Exception as e:  # noqa: BLE001 -- as above
        raise RequestError(400, f"The tools cannot be turned into a tool-call grammar: {clean_grammar_error(e)}",
                           param="tools") from None

"""The tool-call formats, by upstream's --tool-call-parser names.

    qwen25 / qwen / qwen3   <tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>   (hermes style; one
                            block per call)
    llama3                  {"name": "f", "parameters": {...}}, optionally after <|python_tag|>; several calls
                            separated by ";"
    mistral                 [TOOL_CALLS] [{"name": "f", "arguments": {...}}, ...]

Both "arguments" and "parameters" are accepted as the arguments' key by every format.
"""

from __future__ import annotations

from typing import Dict, Type

from sglang.srt.function_call.base_format_detector import BaseFormatDetector


class Qwen25Detector(BaseFormatDetector):
    name = "qwen25"
    call_begin = "<tool_call>"
    call_end = "</tool_call>"
    grammar_call_prefix = "<tool_call>\n"
    grammar_call_suffix = "\n</tool_call>"
    grammar_separator = "\n"


class Llama3Detector(BaseFormatDetector):
    name = "llama3"
    start = "<|python_tag|>"  # a special token: with skip_special_tokens it is gone and the call is bare JSON
    separator = ";"
    bare_json_start = True
    grammar_arguments_key = "parameters"
    grammar_separator = "; "


class MistralDetector(BaseFormatDetector):
    name = "mistral"
    start = "[TOOL_CALLS]"
    array = True
    separator = ","
    grammar_start = "[TOOL_CALLS] "
    grammar_separator = ", "


TOOL_CALL_PARSERS: Dict[str, Type[BaseFormatDetector]] = {
    "qwen25": Qwen25Detector,
    "qwen": Qwen25Detector,
    "qwen3": Qwen25Detector,
    "llama3": Llama3Detector,
    "mistral": MistralDetector,
}


def make_detector(name: str) -> BaseFormatDetector:
    return TOOL_CALL_PARSERS[name]()

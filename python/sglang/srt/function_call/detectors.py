"""The tool-call formats, by upstream's --tool-call-parser names.

    qwen25 / qwen / qwen3   <tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>   (hermes style; one
                            block per call)
    llama3                  {"name": "f", "parameters": {...}}, optionally after <|python_tag|>; several calls
                            separated by ";"
    mistral                 [TOOL_CALLS] [{"name": "f", "arguments": {...}}, ...]
    deepseekv3              <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{...}\n```
                            <｜tool▁call▁end｜> (more calls, newline-separated) <｜tool▁calls▁end｜>: the name
                            outside the JSON, the arguments object in a json code fence
    pythonic                [f(a=1, b="x"), g()]: a Python list of calls, keyword arguments only, read with `ast`
                            (pythonic_detector.py); tool_choice required / named cannot be enforced in it

Both "arguments" and "parameters" are accepted as the arguments' key by every format.
"""

from __future__ import annotations

from typing import Dict, Type

from sglang.srt.function_call.base_format_detector import BaseFormatDetector
from sglang.srt.function_call.pythonic_detector import PythonicDetector


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


class DeepSeekV3Detector(BaseFormatDetector):
    name = "deepseekv3"
    start = "<｜tool▁calls▁begin｜>"
    call_begin = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>"
    name_end = "\n```json\n"
    call_end = "```<｜tool▁call▁end｜>"  # after the blank that ends the arguments' line
    end = "<｜tool▁calls▁end｜>"
    grammar_start = start
    grammar_call_prefix = call_begin
    grammar_call_suffix = "\n```<｜tool▁call▁end｜>"
    grammar_separator = "\n"
    grammar_end = end


TOOL_CALL_PARSERS: Dict[str, Type[BaseFormatDetector]] = {
    "qwen25": Qwen25Detector,
    "qwen": Qwen25Detector,
    "qwen3": Qwen25Detector,
    "llama3": Llama3Detector,
    "mistral": MistralDetector,
    "deepseekv3": DeepSeekV3Detector,
    "pythonic": PythonicDetector,
}


def make_detector(name: str) -> BaseFormatDetector:
    return TOOL_CALL_PARSERS[name]()

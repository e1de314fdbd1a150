"""OpenAI's `tools` and `tool_choice` request fields, validated like OpenAI validates them (a malformed tool is a 400
naming e.g. `tools[0].function.name`)."""

from __future__ import annotations

from typing import Any, Dict, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

FUNCTION_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class FunctionDefinition(_Strict):
    name: str = Field(
        pattern=FUNCTION_NAME_PATTERN,
        description="The function's name: 1 to 64 letters, digits, underscores or dashes.",
    )
    description: Optional[str] = None
    parameters: Optional[Dict[str, Any]] = Field(
        None, description="JSON schema of the arguments object (omitted: the function takes no arguments)."
    )
    strict: Optional[bool] = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class ToolChoiceFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: ToolChoiceFunction


ToolChoice = Union[Literal["none", "auto", "required"], NamedToolChoice]

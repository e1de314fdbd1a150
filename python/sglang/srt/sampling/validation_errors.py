"""pydantic ValidationErrors as sentences in the wording of validation.py, e.g.

    Invalid value for max_tokens: Input should be greater than or equal to 1 (got -5).
    Allowed: an integer in [1, 2^31-1].

Given the model class, the "Allowed: ..." part is the description of the field the error is about (every field
declared with a validation.Rule has one), so the range is stated once, where the field is declared.
"""

from __future__ import annotations

import typing
from typing import Any, List, Optional, Sequence

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from sglang.srt.sampling.validation import ParamError, short_repr

# top-level fields whose members are parameters in their own right: error.param names the member
NESTED_PARAMS = ("sampling_params",)
_PRIMITIVE_LABELS = {"str", "int", "float", "bool", "dict", "list", "none"}


def describe_validation_error(err: ValidationError, model_cls: Optional[type] = None) -> tuple[str, Optional[str]]:
    """(message, param). A value that fits no alternative of a union produces one error per alternative; only the
    most specific one (deepest location, i.e. the alternative the client most likely meant) is reported."""
    errors = err.errors(include_url=False)
    if any(_is_branch_label(x) for e in errors for x in e["loc"]):
        deepest = max(len(e["loc"]) for e in errors)
        candidates = [e for e in errors if len(e["loc"]) == deepest]
        # a range/length error says more than "wrong type" from the alternatives that were not meant
        errors = [next((e for e in candidates if not e["type"].endswith("_type")), candidates[0])]
    parts = [_sentence(e, model_cls) for e in errors]
    return " ".join(dict.fromkeys(parts[:4])), _param(_full_loc(errors[0])) if errors else None


def _full_loc(e: dict) -> tuple:
    """The location, extended by the field a cross-field check (a ParamError in a model validator) names."""
    error = (e.get("ctx") or {}).get("error")
    return tuple(e["loc"]) + ((error.param,) if isinstance(error, ParamError) else ())


def _sentence(e: dict, model_cls: Optional[type]) -> str:
    loc = _full_loc(e)
    path = format_loc(loc)
    error = (e.get("ctx") or {}).get("error")
    if isinstance(error, ParamError):
        return error.render(path)
    if e["type"] == "extra_forbidden":
        return f"Unrecognized request argument supplied: {path}."
    if e["type"] == "missing":
        return f"Missing required parameter: {path}."
    info = _field_info(model_cls, loc) if model_cls is not None else None
    allowed = info.description if info is not None and (info.description or "").startswith("Allowed: ") else None
    text = f"Invalid value for {path}: {e['msg']} (got {short_repr(e.get('input'))})."
    return f"{text} {allowed}" if allowed else text


def _param(loc: tuple) -> Optional[str]:
    names = [x for x in loc if isinstance(x, str) and not _is_branch_label(x)]
    if not names:
        return None
    if names[0] in NESTED_PARAMS and len(names) > 1:
        return f"{names[0]}.{names[1]}"
    return names[0]


def _is_branch_label(x) -> bool:
    # pydantic labels union alternatives by type: "str", "list[int]", "constrained-str", or a model's class name
    return isinstance(x, str) and ("[" in x or "-" in x or x in _PRIMITIVE_LABELS or x[:1].isupper())


def format_loc(loc: Sequence) -> str:
    out = ""
    for x in loc:
        if _is_branch_label(x):
            continue
        out += f"[{x}]" if isinstance(x, int) else (f".{x}" if out else str(x))
    return out or "body"


def _field_info(model_cls: type, loc: Sequence) -> Optional[FieldInfo]:
    """The FieldInfo of the innermost model field on `loc` (list indices and union labels skipped)."""
    info, annotation = None, model_cls
    for key in loc:
        if not isinstance(key, str):
            continue
        hit = next((m.model_fields[key] for m in _models_in(annotation) if key in m.model_fields), None)
        if hit is not None:
            info, annotation = hit, hit.annotation
    return info


def _models_in(annotation: Any) -> List[type]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]

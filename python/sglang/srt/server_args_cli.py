"""The `sglang serve` command line, generated from the ServerArgs dataclass (server_args.py).

Each field is one flag, shown in --help under its field's group (metadata "group": upstream's section names, in the
order of server_args.SERVER_ARGS_GROUPS), with its help text, its default and its allowed values. This module does
not import server_args (the dataclass is passed in), so the two never import each other.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Dict, Sequence


def field_type(f: dataclasses.Field):
    """The scalar type of a field annotated str / int / float / bool, optionally Optional[...]."""
    t = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    t = t.replace("Optional[", "").rstrip("]")
    return {"str": str, "int": int, "float": float, "bool": bool}[t]


def flag_of(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def add_cli_args(parser: argparse.ArgumentParser, cls: type, group_order: Sequence[str]) -> None:
    """One flag per field of `cls`, each in the argument group its metadata names (groups made in group_order)."""
    groups: Dict[str, Any] = {name: parser.add_argument_group(name) for name in group_order}
    for f in dataclasses.fields(cls):
        group = f.metadata.get("group")
        if group not in groups:
            raise ValueError(f"ServerArgs.{f.name} declares group {group!r}, not one of {list(group_order)}")
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        # argparse %-formats help strings: a literal % (a quality figure, a fraction) is written %%
        help_text = f"{f.metadata.get('help', '')} (default: {default})".replace("%", "%%")
        kwargs: Dict[str, Any] = {"dest": f.name, "help": help_text, "default": default}
        ftype = field_type(f)
        if ftype is bool:
            groups[group].add_argument(flag_of(f), action="store_true", **kwargs)
            continue
        kwargs["type"] = ftype
        if "choices" in f.metadata:
            kwargs["choices"] = f.metadata["choices"]
        groups[group].add_argument(flag_of(f), **kwargs)


def cli_kwargs(cls: type, args: argparse.Namespace) -> Dict[str, Any]:
    """The dataclass keyword arguments an argparse namespace carries (flags of other commands are left out)."""
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}

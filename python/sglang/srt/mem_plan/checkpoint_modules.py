"""Which modules a quantized checkpoint leaves unquantized, by each format's own matching rule (torch-free).

Names are matched as the checkpoint spells them: a WeightGroup's module (arch_spec.py) is its tensor name with each
layer / expert index written '*'; the module a weight belongs to is that name less its last part
("model.layers.*.self_attn.q_proj.weight" -> "model.layers.*.self_attn.q_proj").

    transformers' quantizers (fp8, mxfp4, awq, gptq: modules_to_not_convert)
        an entry is a regular expression matched from the start of the module name up to a module boundary
        ("model.layers.*.self_attn" covers every layer's q/k/v/o; "mlp.gate" does not cover "mlp.gate_proj"), or a
        plain suffix of the name ("lm_head").
    compressed-tensors (targets, ignore)
        "re:<regex>" matched from the start of the module name; any other entry is a module name matched exactly,
        or a torch class name ("Linear": every linear layer). A class name other than Linear (e.g.
        "Llama4TextAttention") cannot be resolved from tensor names and is refused, naming it.

compressed-tensors writes its ignore list as the exact names of the modules left dense, one per layer
("model.layers.0.mlp.gate", "model.layers.1.mlp.gate", ...): those are counted, so a WeightGroup of N instances with
k of them named holds k dense and N - k quantized (the instances of a group are alike). A pattern that would hold for
some layers and not others ("model.layers.0.mlp" in modules_to_not_convert, a "re:" regex naming indices) is
refused rather than applied to every layer or none: which instances it covers cannot be counted.
"""

from __future__ import annotations

import re
from typing import Callable, Iterable

# indices tried in place of '*' (with every number the entry itself spells): a rule must treat all of them alike
_PROBE_INDICES = ("0", "1", "9999")
LINEAR_CLASS = "Linear"


def module_of(tensor_name: str) -> str:
    """The module a tensor belongs to: its name less the last part."""
    return tensor_name.rsplit(".", 1)[0]


def _refuse_per_layer(field: str, entry: str) -> ValueError:
    return ValueError(f"quantization_config.{field} entry {entry!r} names single layers; the planner prices rules "
                      "that hold for every layer alike (its weight groups count a module once for all layers), so "
                      "it cannot say which layers stay unquantized. Plan with a list that names modules, not layer "
                      "indices.")


def _for_every_index(module: str, field: str, entry: str, match: Callable[[str], bool]) -> bool:
    """match() on the module with each '*' replaced by an index; ValueError when the indices disagree."""
    if "*" not in module:
        return match(module)
    probes = set(_PROBE_INDICES) | set(re.findall(r"\d+", entry))
    results = {match(module.replace("*", i)) for i in probes}
    if len(results) > 1:
        raise _refuse_per_layer(field, entry)
    return results.pop()


def hf_not_converted(module: str, patterns: Iterable[str], field: str = "modules_to_not_convert") -> bool:
    """transformers' rule: a pattern matches the module name from its start to a module boundary (as a regex), or
    is a suffix of it."""
    for p in patterns or ():
        boundary = re.compile(rf"(?:{p})(?:(?<=\.)|(?=\.|$))")

        def match(name: str, p=p, boundary=boundary) -> bool:
            return name.endswith(p) or boundary.match(name) is not None

        if _for_every_index(module, field, p, match):
            return True
    return False


def _ct_entry_matches(module: str, linear: bool, entry: str, field: str) -> bool:
    """A "re:" regex or a class name (every instance alike, or refused); exact names are counted in ct_instances."""
    if entry.startswith("re:"):
        rx = re.compile(entry[3:])
        return _for_every_index(module, field, entry, lambda name: rx.match(name) is not None)
    if entry == LINEAR_CLASS:
        return linear
    if "." not in entry and entry[:1].isupper():
        raise ValueError(f"quantization_config.{field} entry {entry!r} is a module class the planner cannot resolve "
                         f"from the checkpoint's tensor names; it resolves {LINEAR_CLASS!r}, 're:<regex>' and module "
                         "names. Plan with a list in those terms.")
    return "*" not in module and entry == module


def ct_instances(module: str, count: int, linear: bool, entries: Iterable[str], field: str) -> int:
    """How many of a WeightGroup's `count` instances compressed-tensors' targets / ignore entries match: all of them
    for a matching regex or class, else the number of distinct exact names that spell this module with indices."""
    entries = tuple(entries or ())
    if any(_ct_entry_matches(module, linear, e, field) for e in entries):
        return count
    if "*" not in module:
        return 0
    spelled = re.compile(re.escape(module).replace(r"\*", r"\d+") + "$")
    named = {e for e in entries if not e.startswith("re:") and spelled.match(e)}
    if len(named) > count:
        raise ValueError(f"quantization_config.{field} names {len(named)} instances of {module} (e.g. "
                         f"{sorted(named)[0]!r}); the model has {count} on this rank. Check that the checkpoint is of "
                         "this config.")
    return len(named)

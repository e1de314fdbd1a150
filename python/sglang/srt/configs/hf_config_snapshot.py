"""A text model's resolved Hugging Face config as plain data, so that a warm start skips transformers' config classes.

With transformers 5, `AutoConfig.from_pretrained` of a Llama directory imports configuration_llama, which pulls in
activations, hub kernels, accelerate and sympy: 2-3 s of CPU, in the scheduler process (ModelConfig) and again in the
main process (AutoTokenizer resolves the config too), on the critical path of a 2-core start. The resolved config is
a pure function of config.json and the transformers version, so:

* a start that ran AutoConfig writes the values of the config's attributes and data properties to
  <startup cache>/hf-config-<digest>.json (the directory of mem_plan/measurement_cache.py), keyed by config.json's
  bytes, the model directory and the transformers version; only when every value is plain data (numbers, strings,
  lists, dicts, None, torch dtypes) and decoding the file gives back exactly those values, so a config with
  sub-configs (multimodal) or anything else is never snapshotted;
* a later start with the same key gets an HFConfigSnapshot: the same attribute values, without transformers' config
  classes. It is what the models read (attributes only), and what AutoTokenizer gets as `config=` where the decision
  cannot depend on the config's class (tokenizer_config.json names its tokenizer_class and no remote code:
  tokenizer_kwargs()).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import warnings
from importlib import metadata
from typing import Any, Optional

from sglang.srt.mem_plan.measurement_cache import cache_file, write_json_atomic

logger = logging.getLogger(__name__)

SNAPSHOT_FORMAT_VERSION = 2  # 2: attribute_map aliases included


class NotPlainData(ValueError):
    pass


class HFConfigSnapshot:
    """Attribute access to a snapshotted config; torch dtypes are resolved on first access (torch is imported then)."""

    def __init__(self, values: dict, dtypes: dict, source: str):
        self.__dict__.update(values)
        self._snapshot_dtypes = dict(dtypes)
        self._snapshot_source = source

    def __getattr__(self, name: str) -> Any:  # only called for names not in __dict__
        dtypes = self.__dict__.get("_snapshot_dtypes", {})
        if name in dtypes:
            import torch

            value = getattr(torch, dtypes[name])
            setattr(self, name, value)
            return value
        raise AttributeError(f"{type(self).__name__} of {self.__dict__.get('_snapshot_source')!r} has no {name!r}")

    def __repr__(self) -> str:
        return f"HFConfigSnapshot({self._snapshot_source})"


def _encode(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v) for v in value]}
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and "__items__" not in value and "__tuple__" not in value:
            return {k: _encode(v) for k, v in value.items()}
        return {"__items__": [[_encode(k), _encode(v)] for k, v in value.items()]}
    raise NotPlainData(type(value).__name__)


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, dict):
        if set(value) == {"__tuple__"}:
            return tuple(_decode(v) for v in value["__tuple__"])
        if set(value) == {"__items__"}:
            return {_decode_key(k): _decode(v) for k, v in value["__items__"]}
        return {k: _decode(v) for k, v in value.items()}
    return value


def _decode_key(key: Any) -> Any:
    return tuple(_decode(k) for k in key["__tuple__"]) if isinstance(key, dict) else key


def config_values(config: Any) -> dict:
    """The config's instance attributes (and their attribute_map aliases), and the values of its class's properties
    that are plain data (read with transformers' deprecation messages silenced: they are copied, not used)."""
    values = dict(vars(config))
    # transformers' attribute_map aliases are no attributes (Qwen3MoeConfig reads num_experts from num_local_experts):
    # copied under the alias too, so a model reads them from a snapshot as it does from the config
    for alias, target in (getattr(type(config), "attribute_map", None) or {}).items():
        if alias not in values and target in values:
            values[alias] = values[target]
    try:
        from transformers.utils import logging as hf_logging

        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
    except ImportError:
        hf_logging = None
    try:
        for name, _ in inspect.getmembers(type(config), lambda m: isinstance(m, property)):
            if name in values:
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    value = getattr(config, name)
                    _split({name: value})
                except Exception:  # noqa: BLE001 - a property that cannot be read as plain data is left out
                    continue
            values[name] = value
    finally:
        if hf_logging is not None:
            hf_logging.set_verbosity(verbosity)
    return values


def snapshot_key(model_path: str) -> dict:
    with open(os.path.join(model_path, "config.json"), "rb") as f:
        config_sha = hashlib.sha256(f.read()).hexdigest()
    return {"format": SNAPSHOT_FORMAT_VERSION, "model_path": os.path.realpath(model_path), "config_sha256": config_sha,
            "transformers": metadata.version("transformers")}


def _split(values: dict) -> tuple[dict, dict]:
    """(plain values encoded, {name: torch dtype name}); NotPlainData for anything else."""
    plain, dtypes = {}, {}
    for name, value in values.items():
        if type(value).__module__ == "torch" and type(value).__name__ == "dtype":
            dtypes[name] = str(value).removeprefix("torch.")
        else:
            plain[name] = _encode(value)
    return plain, dtypes


def write_snapshot(config: Any, model_path: str, cache_dir: str) -> Optional[str]:
    """Store the config's values for later starts; None (nothing written) unless they survive the round trip."""
    values = config_values(config)
    try:
        plain, dtypes = _split(values)
    except NotPlainData as e:
        logger.debug("No config snapshot for %s: a %s value", model_path, e)
        return None
    snap = HFConfigSnapshot(_decode(json.loads(json.dumps(plain))), dtypes, model_path)
    for name, value in values.items():
        got = getattr(snap, name)
        if type(got) is not type(value) or got != value:
            logger.debug("No config snapshot for %s: %s does not survive the round trip", model_path, name)
            return None
    key = snapshot_key(model_path)
    path = cache_file(cache_dir, "hf-config", key)
    write_json_atomic(path, {"key": key, "values": plain, "dtypes": dtypes}, "config snapshot")
    return path


def read_snapshot(model_path: str, cache_dir: str) -> Optional[HFConfigSnapshot]:
    """The snapshot stored for this config.json, transformers version and directory, else None."""
    try:
        key = snapshot_key(model_path)
        with open(cache_file(cache_dir, "hf-config", key)) as f:
            data = json.load(f)
    except (OSError, ValueError, metadata.PackageNotFoundError):
        return None
    if not isinstance(data, dict) or data.get("key") != key:
        return None
    return HFConfigSnapshot(_decode(data.get("values") or {}), data.get("dtypes") or {}, model_path)


def load_hf_config(model_path: str, cache_dir: Optional[str]):
    """The model's config: a snapshot from an earlier start, else AutoConfig (then snapshotted when possible)."""
    if cache_dir is not None:
        snap = read_snapshot(model_path, cache_dir)
        if snap is not None:
            return snap
    from transformers import CONFIG_MAPPING, AutoConfig

    from sglang.srt.mem_plan.arch_registry import canonical_model_type
    from sglang.srt.mem_plan.model_shapes import load_config

    model_type = load_config(model_path).get("model_type")
    canonical = canonical_model_type(model_type) if model_type else None
    if model_type not in CONFIG_MAPPING and canonical in CONFIG_MAPPING:
        # a model_type transformers reads only through the checkpoint's own code whose config is an architecture it
        # knows (Kimi-K2: DeepSeek-V3's keys under model_type kimi_k2): read by that architecture's config class
        config = CONFIG_MAPPING[canonical].from_pretrained(model_path)
    else:
        config = AutoConfig.from_pretrained(model_path, trust_remote_code=False)
    if cache_dir is not None:
        write_snapshot(config, model_path, cache_dir)
    return config


def tokenizer_kwargs(tokenizer_path: str, cache_dir: Optional[str]) -> dict:
    """{"config": snapshot} for AutoTokenizer where that is what it would resolve anyway: a snapshot exists and
    tokenizer_config.json names the tokenizer class without remote code (AutoTokenizer then reads only the config's
    attributes, never its class); else {} (AutoTokenizer loads the config itself)."""
    if cache_dir is None:
        return {}
    try:
        with open(os.path.join(tokenizer_path, "tokenizer_config.json")) as f:
            tok_config = json.load(f)
    except (OSError, ValueError):
        return {}
    if not isinstance(tok_config, dict) or not tok_config.get("tokenizer_class") or "auto_map" in tok_config:
        return {}
    snap = read_snapshot(tokenizer_path, cache_dir)
    return {"config": snap} if snap is not None else {}

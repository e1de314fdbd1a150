"""Client-sent logit processors (upstream's `custom_logit_processor`), served only with --enable-custom-logit-processor.

SECURITY: a processor is Python code pickled by the client; loading it runs whatever the client wrote, in the HTTP
process (which loads it once to answer a bad one with 400) and in the scheduler. A server started with the flag gives
every client that can reach it the server user's shell; without the flag a request carrying one gets 400.

Wire format (upstream's): a JSON string {"callable": "<hex of the dill-pickled class>"}. A client subclasses
CustomLogitProcessor, implements __call__(logits, custom_param_list) -> logits, and sends `MyProc().to_str()` as the
request's `custom_logit_processor`, with per-request parameters in sampling params' `custom_params`.

The sampler (sampler.py) calls apply_custom_logit_processors_ first, on the raw logits, before penalties, biases,
grammar masks and temperature: each distinct processor string is loaded once (an LRU cache of instances) and called
once per step with the logits rows of the requests that carry it, [n, V] float32, and their custom_params dicts
(each with "__req__": the scheduler's request object, upstream's convention); the rows it returns replace them. A
processor that raises fails the step, and the scheduler's fault confinement (managers/fault_confinement.py) narrows
that down to the requests carrying it: they fail with the exception text, the others go on.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from functools import lru_cache
from typing import Any, Dict, List, Optional, Sequence

import torch

from sglang.srt.sampling.topk_topp import to_device

LOADED_PROCESSORS_CACHE_SIZE = 64  # distinct processor strings kept loaded per process


class CustomLogitProcessor(ABC):
    """Subclass, implement __call__, send `MyProcessor().to_str()`."""

    @abstractmethod
    def __call__(self, logits: torch.Tensor, custom_param_list: Optional[List[Dict[str, Any]]] = None) -> torch.Tensor:
        """logits: [n, V] rows of the requests carrying this processor; custom_param_list: their custom_params
        (one dict per row). Return the new rows (modifying `logits` in place and returning it is fine)."""

    @classmethod
    def to_str(cls) -> str:
        """The class, pickled by value where it was defined in a script (dill), as upstream's JSON string."""
        import dill  # only the client and a server with the flag need it

        return json.dumps({"callable": dill.dumps(cls, recurse=True).hex()})

    @classmethod
    def from_str(cls, json_str: str) -> "CustomLogitProcessor":
        """A new instance of the class a string carries (loading each distinct string once)."""
        return _load_class(json_str)()


@lru_cache(maxsize=LOADED_PROCESSORS_CACHE_SIZE)
def _load_class(json_str: str) -> type:
    import dill

    try:
        payload = json.loads(json_str)
        blob = bytes.fromhex(payload["callable"])
    except (ValueError, TypeError, KeyError) as e:
        raise ValueError('expected upstream\'s format, a JSON string {"callable": "<hex of a dill-pickled class>"} '
                         f"as CustomLogitProcessor.to_str() writes it ({type(e).__name__}: {e})") from None
    loaded = dill.loads(blob)
    if not isinstance(loaded, type) or not callable(loaded):
        raise ValueError(f"the payload is a {type(loaded).__name__}, not a logit-processor class")
    return loaded


@lru_cache(maxsize=LOADED_PROCESSORS_CACHE_SIZE)
def processor_of(json_str: str) -> Any:
    """The one instance the sampler calls for a processor string."""
    return _load_class(json_str)()


def check_loadable(json_str: str) -> None:
    """At the API edge: raises ValueError (with the reason) if the string does not load into a processor."""
    if not isinstance(json_str, str) or not json_str:
        raise ValueError("custom_logit_processor must be a non-empty string")
    try:
        processor_of(json_str)
    except ValueError:
        raise
    except Exception as e:  # noqa: BLE001 - whatever the client's pickle raises, reported to it
        raise ValueError(f"it could not be loaded: {type(e).__name__}: {e}") from None


def has_custom_processor(reqs: Sequence[Any]) -> bool:
    return any(getattr(r, "custom_logit_processor", None) for r in reqs)


def apply_custom_logit_processors_(logits: torch.Tensor, reqs: Sequence[Any]) -> None:
    """Run each distinct processor over the rows of the requests that carry it, writing the result back."""
    rows_of: Dict[str, List[int]] = {}
    for i, r in enumerate(reqs):
        s = getattr(r, "custom_logit_processor", None)
        if s:
            rows_of.setdefault(s, []).append(i)
    for s, rows in rows_of.items():
        params = [dict(reqs[i].sampling_params.custom_params or {}, __req__=reqs[i]) for i in rows]
        index = to_device(rows, torch.int64, logits.device)
        out = processor_of(s)(logits[index], params)
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (len(rows), logits.shape[1]):
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise TypeError(f"the custom logit processor returned {got}; it must return the logits rows it was "
                            f"given, shape ({len(rows)}, {logits.shape[1]})")
        logits[index] = out.to(logits.dtype)

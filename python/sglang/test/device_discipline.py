"""Device discipline checked on a CPU: run device-side code with its tensors on the `meta` device (the stand-in for
a GPU) and the host bookkeeping on real CPU tensors, and catch what a GPU would punish.

`DeviceDiscipline` is a TorchDispatchMode: it sees every aten op the code under test runs and applies CUDA's rules
to the stand-in device:
  * device mismatch: an op whose tensor arguments sit on two devices raises `DeviceMismatch` naming the op and the
    runtime line that ran it -- as CUDA raises "Expected all tensors to be on the same device". CUDA's exceptions
    are kept: a 0-dim CPU tensor is a scalar; copy_ / _to_copy move data between devices; advanced indexing
    (aten.index.Tensor, index_put_) takes CPU index tensors.
  * host syncs: every read of a device tensor's values by the host -- item() / int() / bool() / float()
    (aten._local_scalar_dense), tolist() / .cpu() / .to("cpu") / numpy() (a copy to the CPU) -- is recorded in
    `syncs` with its call site, and answered with zeros (a meta tensor has no data; `answer` picks other values),
    so the code runs on.
  * data-dependent shapes: ops whose output size depends on device values (nonzero, unique, masked_select,
    bincount, boolean-mask indexing, repeat_interleave without output_size) make CUDA wait for the device; on the
    stand-in they cannot run at all. They raise `DataDependentOp` naming the op and the line.
Host-to-device copies are counted in `h2d_copies` (they do not stall the host when the source is pinned).

A boolean-mask assignment of a scalar (`x[mask] = 0.0`) is not data dependent: CUDA runs it as masked_fill_.

Usage:
    with DeviceDiscipline() as dd:
        step(...)            # tensors that stand for device tensors live on "meta"
    assert len(dd.syncs) <= 1, dd.report()
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Callable, List, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

STANDIN_DEVICE = "meta"
aten = torch.ops.aten


class DeviceMismatch(RuntimeError):
    """An op mixed a device tensor with a host tensor (CUDA raises the same)."""


class DataDependentOp(RuntimeError):
    """An op whose output shape depends on device values (CUDA syncs the host on it)."""


@dataclass(frozen=True)
class Sync:
    op: str
    where: str  # file:line function -- the runtime line that asked for device values

    def __str__(self) -> str:
        return f"{self.op} at {self.where}"


# ops that move data between devices, or take CPU index tensors beside a device tensor, by CUDA's rules
_CROSS_DEVICE_OPS = {aten.copy_.default, aten._to_copy.default, aten.lift_fresh.default, aten.lift_fresh_copy.default,
                     aten._copy_from.default, aten._copy_from_and_resize.default, aten.to.dtype_layout,
                     aten.to.device, aten.to.other}
_INDEX_OPS = {aten.index.Tensor, aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default}
_DATA_DEPENDENT_OPS = {aten.nonzero.default, aten.nonzero_static.default, aten.argwhere.default,
                       aten.masked_select.default, aten._unique.default, aten._unique2.default,
                       aten.unique_dim.default, aten.unique_consecutive.default, aten.bincount.default,
                       aten.repeat_interleave.Tensor, aten.histc.default}
_MARKERS = ("/sglang/srt/", "/sglang/jit_kernel/")


def _call_site() -> str:
    """The innermost frame in the runtime's code (else the innermost frame outside torch and this module)."""
    frames = traceback.extract_stack()[:-3]
    for f in reversed(frames):
        if any(m in f.filename for m in _MARKERS):
            return f"{f.filename.split('/sglang/', 1)[-1]}:{f.lineno} {f.name}"
    for f in reversed(frames):
        if "/torch/" not in f.filename and not f.filename.endswith("device_discipline.py"):
            return f"{f.filename}:{f.lineno} {f.name}"
    return "?"


def _tensors(x) -> List[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for y in x for t in _tensors(y)]
    if isinstance(x, dict):
        return [t for y in x.values() for t in _tensors(y)]
    return []


def _on_device(t: torch.Tensor) -> bool:
    return t.device.type == STANDIN_DEVICE


def _host_array(t: torch.Tensor) -> bool:
    """A CPU tensor that is not a scalar (CUDA accepts 0-dim CPU tensors as scalars)."""
    return t.device.type == "cpu" and t.dim() > 0


@dataclass
class DeviceDiscipline(TorchDispatchMode):
    syncs: List[Sync] = field(default_factory=list)
    h2d_copies: int = 0
    # what a read of device values returns (a meta tensor has none): value -> host tensor of its shape and dtype;
    # zeros unless a test needs a particular value (e.g. a token its grammar accepts)
    answer: Optional[Callable[[torch.Tensor], torch.Tensor]] = None

    def __post_init__(self):
        super().__init__()

    # ------------------------------------------------------------------ reporting
    def report(self) -> str:
        lines = [f"{len(self.syncs)} host sync(s):"] + [f"  {s}" for s in self.syncs]
        return "\n".join(lines)

    def reset(self) -> None:
        self.syncs.clear()
        self.h2d_copies = 0

    # ------------------------------------------------------------------ the rules
    def _sync(self, func) -> None:
        self.syncs.append(Sync(str(func.overloadpacket.__name__), _call_site()))

    def _check_devices(self, func, args, kwargs) -> None:
        if func in _CROSS_DEVICE_OPS:
            return
        if func in _INDEX_OPS:
            # self (and values) must be on one device; index tensors may be host arrays
            indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
            index_ids = {id(t) for t in _tensors(indices)}
            tensors = [t for t in _tensors(args) + _tensors(kwargs) if id(t) not in index_ids]
        else:
            tensors = _tensors(args) + _tensors(kwargs)
        if any(_on_device(t) for t in tensors) and any(_host_array(t) for t in tensors):
            shapes = ", ".join(f"{t.device.type}{list(t.shape)}" for t in tensors)
            raise DeviceMismatch(f"{func} mixes device and host tensors ({shapes}) at {_call_site()}: CUDA raises "
                                 "'Expected all tensors to be on the same device'")

    def _check_data_dependent(self, func, args, kwargs) -> None:
        dependent = func in _DATA_DEPENDENT_OPS
        if func in _INDEX_OPS:
            indices = [t for t in _tensors(args[1] if len(args) > 1 else ()) if t is not None]
            masks = [t for t in indices if t.dtype in (torch.bool, torch.uint8) and _on_device(t)]
            if masks:
                values = args[2] if len(args) > 2 else None
                masked_fill = (func is not aten.index.Tensor and len(indices) == 1 and isinstance(values, torch.Tensor)
                               and values.dim() == 0)
                dependent = not masked_fill
        if dependent and any(_on_device(t) for t in _tensors(args) + _tensors(kwargs)):
            self._sync(func)
            raise DataDependentOp(f"{func} has an output shape that depends on device values, at {_call_site()}: on "
                                  "a GPU it waits for the device (a host sync); keep it off the step")

    def _host_value(self, src: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if self.answer is None:
            return torch.zeros(src.shape, dtype=dtype)
        with _disable_current_modes():
            return self.answer(src).to(dtype).expand(src.shape).clone()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self._check_devices(func, args, kwargs)
        self._check_data_dependent(func, args, kwargs)
        if func in _SCALAR_READS and _on_device(args[0]):
            self._sync(func)
            return False if args[0].dtype == torch.bool else 0
        moved = _move_target(func, args, kwargs)
        if moved is not None:
            src, target, dtype = moved
            if _on_device(src) and target == "cpu":
                self._sync(func)
                return self._host_value(src, dtype)
            if _host_array(src) and target == STANDIN_DEVICE:
                self.h2d_copies += 1
        if func is aten.copy_.default:
            dst, src = args[0], args[1]
            if _on_device(src) and dst.device.type == "cpu":
                self._sync(func)
                return dst.copy_(self._host_value(src, dst.dtype))
            if _host_array(src) and _on_device(dst):
                self.h2d_copies += 1
        return func(*args, **kwargs)


# reads of device values as one host value (item(), int(), bool(), float(), torch.equal): under inference_mode
# aten.item and aten.is_nonzero arrive undecomposed
_SCALAR_READS = {aten._local_scalar_dense.default, aten.item.default, aten.is_nonzero.default, aten.equal.default}


def _move_target(func, args, kwargs):
    """(source, target device type, result dtype) of a device move (.to / .cpu / _to_copy), else None. Under
    inference_mode the composite aten.to overloads arrive here undecomposed, so each is read as its schema says."""
    src = args[0] if args and isinstance(args[0], torch.Tensor) else None
    if src is None:
        return None
    if func is aten._to_copy.default or func is aten.to.dtype_layout:
        device, dtype = kwargs.get("device"), kwargs.get("dtype")
    elif func is aten.to.device:
        device = args[1] if len(args) > 1 else kwargs.get("device")
        dtype = args[2] if len(args) > 2 else kwargs.get("dtype")
    elif func is aten.to.other:
        other = args[1] if len(args) > 1 else kwargs["other"]
        device, dtype = other.device, other.dtype
    else:
        return None
    if device is None:
        return None
    return src, torch.device(device).type, dtype or src.dtype

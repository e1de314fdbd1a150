"""Small runtime utilities. Upstream's commonly imported names are re-exported here (`from sglang.srt.utils import
kill_process_tree, is_hip`), each defined in its own module; the rest is imported from its module."""

from sglang.srt.utils.platform import get_device, is_cpu, is_cuda, is_cuda_alike, is_hip, is_npu, is_xpu
from sglang.srt.utils.process_tree import kill_child_process, kill_process_tree

__all__ = ["get_device", "is_cpu", "is_cuda", "is_cuda_alike", "is_hip", "is_npu", "is_xpu", "kill_child_process",
           "kill_process_tree"]

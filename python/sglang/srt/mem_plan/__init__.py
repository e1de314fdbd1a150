"""Memory planning: Spec -> Measure -> Plan -> Allocate.

Pure and torch-free at import: components declare their needs as integers (specs.py, backends.py, encoder.py,
model_shapes.py), measure.py is the only module that touches a device (lazily), plan_memory() turns integers into
a frozen MemoryPlan, and the runner allocates exactly what the plan says.

    from sglang.srt.mem_plan import PlanInputs, WorkspaceSpec, MemoryPlan, MemoryPlanError, plan_memory
"""

from sglang.srt.mem_plan.errors import MemoryPlanError
from sglang.srt.mem_plan.inputs import PlanInputs
from sglang.srt.mem_plan.plan import MemoryPlan, MemoryTerm
from sglang.srt.mem_plan.planner import plan_memory
from sglang.srt.mem_plan.slots import SlotRule, max_num_reqs
from sglang.srt.mem_plan.solver import SlotCost, linear_regime_tokens, solve_max_tokens
from sglang.srt.mem_plan.sizes import req_to_token_bytes
from sglang.srt.mem_plan.specs import KVCellSpec, WorkspaceSpec, kv_dtype_bytes

__all__ = [
    "KVCellSpec",
    "MemoryPlan",
    "MemoryPlanError",
    "MemoryTerm",
    "PlanInputs",
    "SlotCost",
    "SlotRule",
    "WorkspaceSpec",
    "kv_dtype_bytes",
    "linear_regime_tokens",
    "max_num_reqs",
    "plan_memory",
    "req_to_token_bytes",
    "solve_max_tokens",
]

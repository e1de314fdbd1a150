"""Random Mamba-2 SSD cases and the fp64 reference they are checked against, shared by test_mamba2_ssd.py (torch) and
test_triton_mamba2_interpreted.py (Triton under the interpreter). Not a test file (run_suite collects test_*.py only).

The reference is the recurrence itself, one token at a time in float64, written from the Mamba-2 definition:
    dt = clamp(softplus(dt_raw + dt_bias), lo, hi);  S <- S * exp(dt A) + dt x B^T;  y = S C + D x
with head h reading B / C group h // (nh / ng), and S starting at the request's initial state or at zero.
"""

from __future__ import annotations

import math
from typing import List, Optional, Sequence

import torch


def make_case(lens: Sequence[int], nh: int = 4, hd: int = 8, ng: int = 2, ns: int = 16,
              has_initial: Optional[Sequence[bool]] = None, seed: int = 0, dtype=torch.float32,
              a_max: float = 2.0, nan_unused_states: bool = True) -> dict:
    """Inputs of ssd_extend for requests of `lens` tokens. Rows without an initial state hold NaN (the pool does not
    zero a freed row), so an op that reads them fails loudly."""
    g = torch.Generator().manual_seed(seed)
    n, r = sum(lens), len(lens)
    has = torch.tensor(list(has_initial) if has_initial is not None else [i % 2 == 0 for i in range(r)])
    init = torch.randn(r, nh, hd, ns, generator=g)
    if nan_unused_states:
        init[~has] = math.nan
    return dict(
        x=torch.randn(n, nh, hd, generator=g).to(dtype),
        dt=(torch.randn(n, nh, generator=g) - 1.0).to(dtype),
        A=-torch.rand(nh, generator=g) * a_max - 0.05,
        B=torch.randn(n, ng, ns, generator=g).to(dtype),
        C=torch.randn(n, ng, ns, generator=g).to(dtype),
        D=torch.randn(nh, generator=g),
        dt_bias=torch.randn(nh, generator=g) * 0.5,
        initial_state=init,
        has_initial_state=has,
        extend_lens=list(lens),
    )


def reference_scan(case: dict, dt_limit=(0.0, math.inf)):
    """(y [N, nh, hd], final_state [R, nh, hd, Ns]) in float64, one token at a time."""
    x, B, C = case["x"].double(), case["B"].double(), case["C"].double()
    A, D, bias = case["A"].double(), case["D"].double(), case["dt_bias"].double()
    nh, ng = x.shape[1], B.shape[1]
    group = torch.arange(nh) // (nh // ng)
    step = torch.nn.functional.softplus(case["dt"].double() + bias).clamp(min=dt_limit[0], max=dt_limit[1])
    ys: List[torch.Tensor] = []
    finals = []
    t = 0
    for r, length in enumerate(case["extend_lens"]):
        state = case["initial_state"][r].double().clone()
        if not bool(case["has_initial_state"][r]):
            state = torch.zeros_like(state)
        for _ in range(length):
            d = step[t]  # [nh]
            b, c = B[t][group], C[t][group]  # [nh, Ns]
            state = state * torch.exp(d * A)[:, None, None] + d[:, None, None] * x[t][:, :, None] * b[:, None, :]
            ys.append((state * c[:, None, :]).sum(-1) + D[:, None] * x[t])
            t += 1
        finals.append(state)
    y = torch.stack(ys) if ys else torch.zeros(0, *x.shape[1:], dtype=torch.float64)
    return y, torch.stack(finals)


def op_args(case: dict) -> tuple:
    """The positional arguments of ssd_extend, without chunk_size."""
    return (case["x"], case["dt"], case["A"], case["B"], case["C"], case["D"], case["initial_state"],
            case["has_initial_state"], case["extend_lens"])


def max_rel_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """Max abs error over the reference's scale (at least 1): NaN anywhere counts as infinite."""
    got = got.double()
    if torch.isnan(got).any():
        return math.inf
    return float((got - ref).abs().max()) / max(1.0, float(ref.abs().max())) if ref.numel() else 0.0

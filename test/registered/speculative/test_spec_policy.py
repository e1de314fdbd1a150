"""The adaptive speculation policy (managers/spec_policy.py): a request whose proposals are rejected stops proposing
for PAUSE_STEPS, probes again, and pauses twice as long after a failed probe; accepted proposals keep it going; the
batch budget caps the verify forward's tokens, giving proposals to the best acceptance rate first, and none at all
once the batch alone fills it."""

from types import SimpleNamespace

from sglang.srt.managers import spec_policy as sp
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=2, suite="cpu")


def req(rid, remaining=100):
    return SimpleNamespace(rid=rid, grammar=None, remaining_new_tokens=lambda: remaining)


def test_rejections_pause_then_probe_with_doubling_pauses():
    p = sp.SpecPolicy(max_proposals=7, verify_token_budget=16)
    r = req("a")
    assert p.max_k([r]) == [7]
    p.on_verified(r, 7, 0)  # 0.5 -> 0.25: still proposing (not below MIN_ACCEPT_RATE)
    assert p.max_k([r]) == [7]
    p.on_verified(r, 7, 0)  # below: paused for PAUSE_STEPS steps
    steps = 0
    while p.max_k([r]) == [0]:
        steps += 1
    assert steps == sp.PAUSE_STEPS - 1  # the step that paused it is counted
    p.on_verified(r, 7, 0)  # a failed probe: twice as long
    steps = 0
    while p.max_k([r]) == [0]:
        steps += 1
    assert steps == 2 * sp.PAUSE_STEPS - 1
    p.on_verified(r, 7, 7)  # accepted: proposes on
    assert p.max_k([r]) == [7] and p.max_k([r]) == [7]


def test_budget_goes_to_the_best_rate_and_respects_remaining_tokens():
    p = sp.SpecPolicy(max_proposals=7, verify_token_budget=12)
    a, b, c = req("a"), req("b"), req("c", remaining=3)
    p.max_k([a, b, c])
    p.on_verified(a, 4, 1)  # 0.5 -> 0.375
    p.on_verified(b, 4, 4)  # 0.5 -> 0.75
    p.on_verified(c, 2, 2)  # 0.5 -> 0.75
    # 12 - 3 = 9 extra tokens: b (best, full 7), then c (2 = its remaining tokens - 1, the tie broken by batch
    # order), nothing left for a
    assert p.max_k([a, b, c]) == [0, 7, 2]
    assert p.max_k([req(str(i)) for i in range(12)]) == [0] * 12  # the batch alone fills the budget

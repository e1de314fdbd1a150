"""Fault injection for tests: make a scheduler step raise on a schedule, to exercise fault confinement on CPU.

Read once when the Scheduler is built, from the environment variable SGLANG_FAULT_INJECT (so a server's scheduler
process inherits it). Unset or empty: no injector exists and the call sites cost one `is None` test.

Syntax: one or more rules separated by ";", each
    STEP:KIND[:OPTION,OPTION,...]
STEP    where the fault is raised: prefill (before an extend forward), decode (before a decode forward),
        sample (before sampling a batch), detokenize (before a request's new token is detokenized)
KIND    error -> RuntimeError("injected fault ..."), oom -> torch.OutOfMemoryError("injected out of memory ...")
OPTION  (at most one schedule; the default is every=1)
        at=K       fire in the K-th batch (1-based) that reaches the step, once
        every=N    fire in every N-th batch that reaches the step
        prob=P     fire with probability P per batch, drawn from random.Random(seed)
        rid=SUB    fire whenever a request whose rid contains SUB is in the batch (combines with a schedule: both
                   must hold)
        seed=S     seed of the prob draws (default 0)
        limit=M    fire at most M times in all

An `error` firing dooms one request (the first matching one in the batch): the fault follows that request, like a
request-specific bug, until it has failed; the scheduler isolates it by retrying the rest of the batch without it.
An `oom` firing is transient: it raises once; the scheduler recovers by retracting/splitting, and only a request
named by rid=, which keeps raising, ends up failing alone.
Examples:
    SGLANG_FAULT_INJECT="decode:error:rid=victim"        every decode batch holding a 'victim' request fails it
    SGLANG_FAULT_INJECT="sample:error:every=50"          one request per 50 sampled batches fails
    SGLANG_FAULT_INJECT="decode:oom:at=10;prefill:error:at=3,limit=1"
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Set

import torch

ENV_VAR = "SGLANG_FAULT_INJECT"
STEPS = ("prefill", "decode", "sample", "detokenize")
KINDS = ("error", "oom")


class InjectedFault(RuntimeError):
    """An injected non-OOM fault (a RuntimeError, like most real ones)."""


@dataclass
class FaultRule:
    step: str
    kind: str
    at: Optional[int] = None
    every: Optional[int] = None
    prob: Optional[float] = None
    rid: Optional[str] = None
    seed: int = 0
    limit: Optional[int] = None
    num_batches: int = 0  # distinct batches (scheduler forward counts) that reached the step
    last_batch: Optional[int] = None
    num_fired: int = 0
    doomed: Set[str] = field(default_factory=set)  # rids an `error` firing follows until they fail

    def __post_init__(self):
        self.rng = random.Random(self.seed)

    def _schedule_fires(self) -> bool:
        n = self.num_batches
        if self.at is not None:
            return n == self.at
        if self.prob is not None:
            return self.rng.random() < self.prob
        return n % (self.every or 1) == 0

    def check(self, rids: Sequence[str], batch_no: int) -> None:
        """Raise if this rule fires for these requests of batch number `batch_no`. Retries of a batch (its halves)
        and the requests of a batch detokenized one by one share the batch number: a schedule fires once per batch."""
        fresh = batch_no != self.last_batch
        if fresh:
            self.num_batches += 1
            self.last_batch = batch_no
        if self.doomed:
            hit = [r for r in rids if r in self.doomed]
            if hit:
                self._raise(hit[0])
        if self.limit is not None and self.num_fired >= self.limit:
            return
        candidates = [r for r in rids if self.rid is None or self.rid in r]
        rid_only = self.rid is not None and self.at is None and self.every is None and self.prob is None
        if not candidates or not (rid_only or (fresh and self._schedule_fires())):
            return
        self.num_fired += 1
        if self.kind == "error":
            self.doomed.add(candidates[0])
        self._raise(candidates[0])

    def forget(self, rid: str) -> None:
        self.doomed.discard(rid)

    def _raise(self, rid: str) -> None:
        what = f"at the {self.step} step for request {rid}"
        if self.kind == "oom":
            raise torch.OutOfMemoryError(f"injected out of memory {what}")
        raise InjectedFault(f"injected fault {what}")


def parse_rules(spec: str) -> List[FaultRule]:
    """Parse SGLANG_FAULT_INJECT; ValueError naming the bad part."""
    rules = []
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        fields = part.split(":", 2)
        if len(fields) < 2 or fields[0] not in STEPS or fields[1] not in KINDS:
            raise ValueError(f"{ENV_VAR}: bad rule {part!r}; expected STEP:KIND[:OPTIONS] with STEP in "
                             f"{'/'.join(STEPS)} and KIND in {'/'.join(KINDS)}.")
        rule = FaultRule(fields[0], fields[1])
        for opt in filter(None, (fields[2].split(",") if len(fields) > 2 else [])):
            key, _, value = opt.partition("=")
            try:
                if key in ("at", "every", "seed", "limit"):
                    setattr(rule, key, int(value))
                elif key == "prob":
                    rule.prob = float(value)
                elif key == "rid":
                    rule.rid = value
                else:
                    raise ValueError
            except ValueError:
                raise ValueError(f"{ENV_VAR}: bad option {opt!r} in rule {part!r}; options are at=K, every=N, "
                                 "prob=P, rid=SUB, seed=S, limit=M.") from None
        if sum(x is not None for x in (rule.at, rule.every, rule.prob)) > 1:
            raise ValueError(f"{ENV_VAR}: rule {part!r} has more than one of at=/every=/prob=.")
        if (rule.every is not None and rule.every < 1) or (rule.at is not None and rule.at < 1):
            raise ValueError(f"{ENV_VAR}: at= and every= must be >= 1 in rule {part!r}.")
        rule.rng = random.Random(rule.seed)
        rules.append(rule)
    return rules


class FaultInjector:
    def __init__(self, rules: List[FaultRule]):
        self.rules = rules

    @classmethod
    def from_env(cls) -> Optional["FaultInjector"]:
        spec = os.environ.get(ENV_VAR, "").strip()
        return cls(parse_rules(spec)) if spec else None

    def check(self, step: str, rids: Sequence[str], batch_no: int) -> None:
        for rule in self.rules:
            if rule.step == step:
                rule.check(rids, batch_no)

    def forget(self, rid: str) -> None:
        """A request finished or failed: no rule follows it any more."""
        for rule in self.rules:
            rule.forget(rid)

#!/usr/bin/env python3
"""Fuzz a live server through its own /openapi.json with schemathesis: no request may get a 5xx.

    python scripts/fuzz_openapi.py                      # launches a small-context server, fuzzes it, stops it
    python scripts/fuzz_openapi.py --base-url http://127.0.0.1:30000 --api-key KEY --max-examples 150

Every operation of the schema gets --max-examples cases in each generation mode (positive: bodies that follow the
schema; negative: bodies that break it), sent one at a time. Prints the cases run, a histogram of status codes,
the number of 5xx and the first few 5xx as curl commands with the answer; exits 1 if any 5xx was seen.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

# a small context keeps the generations that valid bodies ask for short
DEFAULT_SERVER_ARGS = ["--context-length", "128", "--max-total-tokens", "8192", "--max-running-requests", "16"]
MAX_REPROS = 5
REQUEST_TIMEOUT_S = 120.0


@dataclass
class FuzzResult:
    cases: int = 0
    status_counts: collections.Counter = field(default_factory=collections.Counter)
    errors_5xx: List[str] = field(default_factory=list)  # repros (first MAX_REPROS)
    num_5xx: int = 0
    transport_errors: List[str] = field(default_factory=list)
    per_operation: Dict[str, int] = field(default_factory=dict)
    skipped: List[str] = field(default_factory=list)  # operation/mode pairs with no case to generate

    def report(self) -> str:
        lines = [f"cases run: {self.cases}",
                 "status codes: " + ", ".join(f"{k}: {v}" for k, v in sorted(self.status_counts.items())),
                 f"5xx responses: {self.num_5xx}",
                 f"transport errors (no response): {len(self.transport_errors)}"]
        lines += [f"  {name}: {n} cases" for name, n in sorted(self.per_operation.items())]
        if self.skipped:
            lines.append("no cases to generate: " + ", ".join(self.skipped))
        for i, repro in enumerate(self.errors_5xx, 1):
            lines.append(f"5xx repro {i}:\n{repro}")
        for err in self.transport_errors[:MAX_REPROS]:
            lines.append(f"transport error: {err}")
        return "\n".join(lines)


def fuzz(base_url: str, api_key: Optional[str] = None, max_examples: int = 60, seed: Optional[int] = 0,
         modes: tuple = ("positive", "negative"), operations: Optional[List[str]] = None) -> FuzzResult:
    """Run schemathesis over every operation of base_url's /openapi.json (or those whose path is in `operations`)."""
    import requests
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, seed as hyp_seed, settings
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json", headers=headers, timeout=30)
    result = FuzzResult()
    session = requests.Session()

    def run_operation(op, mode) -> None:
        name = f"{op.method.upper()} {op.path} [{mode.value}]"

        @settings(max_examples=max_examples, deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(case=op.as_strategy(generation_mode=mode))
        def one(case):
            result.cases += 1
            result.per_operation[name] = result.per_operation.get(name, 0) + 1
            try:
                resp = case.call(base_url=base_url, session=session, headers=headers, timeout=REQUEST_TIMEOUT_S)
            except Exception as e:  # a dropped connection is as bad as a 5xx
                result.transport_errors.append(f"{name}: {type(e).__name__}: {e}")
                return
            result.status_counts[resp.status_code] += 1
            if resp.status_code >= 500:
                result.num_5xx += 1
                if len(result.errors_5xx) < MAX_REPROS:
                    curl = case.as_curl_command(headers=headers, base_url=base_url)
                    result.errors_5xx.append(f"  {curl}\n  -> {resp.status_code} {resp.text[:400]}")

        if seed is not None:
            one = hyp_seed(seed)(one)
        try:
            one()
        except Unsatisfiable:  # e.g. no negative case exists for an operation without parameters or body
            result.skipped.append(name)

    for res in schema.get_all_operations():
        op = res.ok()
        if operations and op.path not in operations:
            continue
        for mode_name in modes:
            run_operation(op, GenerationMode(mode_name))
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", help="fuzz this running server (default: launch one)")
    parser.add_argument("--api-key", help="the server's API key, if it has one")
    parser.add_argument("--max-examples", type=int, default=60, help="cases per operation and generation mode")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed (-1: random)")
    parser.add_argument("--server-args", nargs=argparse.REMAINDER, default=DEFAULT_SERVER_ARGS,
                        help="arguments of the launched server (must come last)")
    args = parser.parse_args(argv)

    server = None
    base_url = args.base_url
    if base_url is None:
        from sglang.test.test_utils import popen_launch_server

        server = popen_launch_server(api_key=args.api_key, other_args=args.server_args)
        base_url = server.base_url
        print(f"launched a server at {base_url} in {server.startup_s:.1f} s ({' '.join(args.server_args)})")
    try:
        started = time.perf_counter()
        result = fuzz(base_url, args.api_key, args.max_examples, None if args.seed < 0 else args.seed)
        print(result.report())
        print(f"fuzzing took {time.perf_counter() - started:.0f} s")
    finally:
        if server is not None:
            server.kill()
    return 1 if result.num_5xx or result.transport_errors else 0


if __name__ == "__main__":
    sys.exit(main())

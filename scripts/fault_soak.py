"""Soak test of fault confinement: a real server with injected faults under streaming load.

Launches `python -m sglang.launch_server` with SGLANG_FAULT_INJECT set so that injected errors in the prefill,
decode, sample and detokenize steps fail about one request per N scheduler steps (--fault-every-steps N; see
fault_spec()), keeps --concurrency streaming /v1/completions requests going for
--duration-s, then waits for the server to go idle and prints:
    requests ok / failed by injection / other errors, whether the server stayed up, the scheduler's fault count,
    leaked tokens (num_used_tokens after idle and flush_cache), memory integrity, and the server's exit code after
    SIGTERM (must be 0).
Exit status 0 when every check holds. `run_soak()` is the same code for the CI test.

    python scripts/fault_soak.py --duration-s 120 --concurrency 32 --fault-every-steps 50
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import requests

from sglang.test.test_utils import DEFAULT_SMALL_SERVER_ARGS, popen_launch_server

PROMPTS = ["The three primary colors are", "def fibonacci(n):", "Once upon a time,", "Water boils at",
           "The quick brown fox", "List three fruits:\n1.", "In mathematics, a prime number is", "import numpy as np\n"]


def fault_spec(every_steps: int) -> str:
    """Decode, sample and detokenize each see about one batch per step, prefill a few: 1/2 + 1/4 + 1/4 of the
    fault rate goes to the first three, and prefill adds its own every N prefill batches."""
    n = every_steps
    return f"prefill:error:every={n};decode:error:every={2 * n};sample:error:every={4 * n};detokenize:error:every={4 * n}"


def one_streaming_request(base_url: str, i: int, max_tokens: int) -> str:
    """'ok', 'injected' (failed by an injected fault, 500 or an SSE error naming it) or 'other: ...'."""
    body = {"prompt": PROMPTS[i % len(PROMPTS)] + f" ({i})", "max_tokens": max_tokens, "stream": True,
            "temperature": 0.8, "seed": i}
    try:
        with requests.post(f"{base_url}/v1/completions", json=body, stream=True, timeout=120) as r:
            if r.status_code != 200:
                text = r.text
                return "injected" if r.status_code == 500 and "injected fault" in text else f"other: {r.status_code} {text[:200]}"
            finished = False
            for line in r.iter_lines(decode_unicode=True):
                if not line or not line.startswith("data: "):
                    continue
                data = line[len("data: "):]
                if data == "[DONE]":
                    return "ok" if finished else "other: [DONE] without a finish_reason"
                msg = json.loads(data)
                if "error" in msg:
                    return "injected" if "injected fault" in json.dumps(msg) else f"other: {data[:200]}"
                if any(c.get("finish_reason") for c in msg.get("choices", [])):
                    finished = True
            return "other: stream ended without [DONE]"
    except requests.RequestException as e:
        return f"other: {type(e).__name__}: {e}"


def wait_idle(base_url: str, timeout_s: float = 60.0) -> dict:
    deadline = time.time() + timeout_s
    info = {}
    while time.time() < deadline:
        info = requests.get(f"{base_url}/server_info", timeout=10).json()
        st = info["internal_states"][0]
        if st["num_running_reqs"] == 0 and st["num_waiting_reqs"] == 0:
            return info
        time.sleep(0.2)
    return info


def run_soak(duration_s: float, concurrency: int, fault_every_steps: int, max_tokens: int = 16) -> dict:
    server = popen_launch_server(other_args=DEFAULT_SMALL_SERVER_ARGS + ["--log-level", "warning"],
                                 env={"SGLANG_FAULT_INJECT": fault_spec(fault_every_steps)})
    counts = {"ok": 0, "injected": 0, "other": 0}
    others = []
    lock = threading.Lock()
    stop_at = time.time() + duration_s
    exited_during_run = None

    def worker(w: int) -> None:
        i = w
        while time.time() < stop_at:
            res = one_streaming_request(server.base_url, i, max_tokens)
            with lock:
                key = res.split(":")[0]
                counts[key] += 1
                if key == "other" and len(others) < 5:
                    others.append(res)
            i += concurrency

    try:
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(worker, range(concurrency)))
        exited_during_run = server.process.poll()
        info = wait_idle(server.base_url)
        requests.post(f"{server.base_url}/flush_cache", timeout=30)
        info = requests.get(f"{server.base_url}/server_info", timeout=10).json()
        stats = info["internal_states"][0]
    finally:
        server.process.terminate()
        try:
            exit_code = server.process.wait(timeout=30)
        except Exception:  # noqa: BLE001
            server.kill()
            exit_code = None
    return {
        "duration_s": duration_s, "concurrency": concurrency, "fault_spec": fault_spec(fault_every_steps),
        "requests_ok": counts["ok"], "requests_failed_by_injection": counts["injected"],
        "requests_other_errors": counts["other"], "other_error_samples": others,
        "server_exited_during_run": exited_during_run, "scheduler_faults": stats.get("num_faults"),
        "scheduler_failed_reqs": stats.get("num_failed_reqs"), "leaked_tokens": stats["num_used_tokens"],
        "memory_integrity": info.get("memory_integrity"), "server_exit_code": exit_code,
    }


def passed(result: dict) -> bool:
    return (result["requests_other_errors"] == 0 and result["server_exited_during_run"] is None
            and result["leaked_tokens"] == 0 and result["memory_integrity"] == "ok"
            and result["server_exit_code"] == 0 and result["requests_ok"] > 0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration-s", type=float, default=120.0, help="how long to keep the load going")
    ap.add_argument("--concurrency", type=int, default=32, help="concurrent streaming requests")
    ap.add_argument("--fault-every-steps", type=int, default=50, help="about one injected fault per this many steps")
    ap.add_argument("--max-tokens", type=int, default=16, help="max_tokens of each request")
    args = ap.parse_args()
    result = run_soak(args.duration_s, args.concurrency, args.fault_every_steps, args.max_tokens)
    for k, v in result.items():
        print(f"{k:32s} {v}")
    ok = passed(result)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

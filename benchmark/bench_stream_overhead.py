"""What streaming costs the server's CPU, in figures that do not depend much on how fast the machine's forward is.

    python benchmark/bench_stream_overhead.py http [-n 64] [-c 32] [--max-tokens 64] [--repeat 2] [server flags]
    python benchmark/bench_stream_overhead.py step [--batch-sizes 1 32 256] [--steps 48] [--profile]

http: starts `python -m sglang.launch_server` (the bundled default model unless --model-path is among the server
      flags), warms it up, then streams N chat completions (/v1/chat/completions, stream=true, ignore_eos,
      --max-tokens tokens, prompts of 100 fresh random words) at concurrency C from this process, and reads the CPU
      time (per thread, /proc/<pid>/task/*/schedstat) of the HTTP process -- the one running uvicorn, FastAPI and the
      TokenizerManager -- and of the scheduler process before and after. Prints microseconds of HTTP-process CPU per
      streamed token, and the same for a run of 1-token requests (the per-request part), so the per-token part is
      their difference. --cprofile FILE profiles the HTTP process's event loop during the run, --py-spy PREFIX
      samples it with py-spy (pip install py-spy).
step: a real Scheduler over the real ModelRunner of the default model, in this process, with the model's forward
      replaced by a stub that returns one-hot logits over the tokens of an English text (so detokenising works on
      real text), runs B streaming requests to decode and times each decode step: step() plus sending its outputs
      over a ZMQ PUSH socket (what the scheduler process does), minus the stub forward and minus sampling. Prints
      milliseconds per step outside the forward at each batch size B (and per request in microseconds).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import random
import statistics
import sys
import time
from typing import List

import psutil

WORDS = ("time year people way day man thing woman life child world school state family student group country "
         "problem hand part place case week company system program question work government number night point "
         "home water room mother area money story fact month lot right study book eye job word business issue side "
         "kind head house service friend father power hour game line end member law car city community name").split()
TEXT = ("The river runs past the old mill, where the children of the village used to play after school. In the "
        "summer the water is low and warm; in winter it freezes at the edges, and the miller's dog — a patient, "
        "grey animal — waits on the bank for the ice to crack. Nobody remembers who built the mill, or why. ") * 4


def thread_cpu_ns(pid: int) -> dict:
    """{(tid, name): CPU nanoseconds} of a process's live threads (/proc/<pid>/task/*/schedstat)."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile
        out[(tid, "event loop" if tid == str(pid) else name)] = ns
    return out


def cpu_s(proc: psutil.Process) -> float:
    """CPU seconds of the process's live threads, in nanoseconds from /proc/<pid>/task/*/schedstat (psutil's
    cpu_times counts in 10 ms ticks, too coarse for a few thousand tokens); psutil where there is no schedstat."""
    total_ns, found = 0, False
    try:
        for tid in os.listdir(f"/proc/{proc.pid}/task"):
            try:
                with open(f"/proc/{proc.pid}/task/{tid}/schedstat") as f:
                    total_ns += int(f.read().split()[0])
                    found = True
            except (OSError, ValueError):
                pass  # a thread that ended meanwhile
    except OSError:
        pass
    if found:
        return total_ns / 1e9
    t = proc.cpu_times()
    return t.user + t.system


# ====================================================================== http
async def stream_one(session, url: str, body: dict) -> tuple:
    """(completion tokens from the usage chunk, number of chunks carrying a choice: role, text, finish)."""
    tokens = chunks = 0
    async with session.post(url, json=body) as resp:
        assert resp.status == 200, await resp.text()
        async for line in resp.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            obj = json.loads(line[6:])
            if obj.get("choices"):
                chunks += 1
            elif obj.get("usage"):
                tokens = obj["usage"]["completion_tokens"]
    return tokens, chunks


async def drive(base_url: str, model: str, n: int, concurrency: int, max_tokens: int, seed: int) -> tuple:
    import aiohttp

    rng = random.Random(seed)
    sem = asyncio.Semaphore(concurrency)
    url = f"{base_url}/v1/chat/completions"

    async def one(session):
        prompt = " ".join(rng.choice(WORDS) for _ in range(100))
        body = {"model": model, "messages": [{"role": "user", "content": prompt}],
                "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        async with sem:
            return await stream_one(session, url, body)

    timeout = aiohttp.ClientTimeout(total=1800)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        results = await asyncio.gather(*[one(session) for _ in range(n)])
    return sum(r[0] for r in results), sum(r[1] for r in results)


def measure_http(server, model: str, n: int, concurrency: int, max_tokens: int, seed: int) -> dict:
    main = psutil.Process(server.process.pid)
    sched = [c for c in main.children(recursive=True)]
    me = psutil.Process()
    before = cpu_s(main), sum(cpu_s(c) for c in sched), cpu_s(me)
    threads_before = thread_cpu_ns(main.pid)
    start = time.perf_counter()
    tokens, chunks = asyncio.run(drive(server.base_url, model, n, concurrency, max_tokens, seed))
    wall = time.perf_counter() - start
    after = cpu_s(main), sum(cpu_s(c) for c in sched), cpu_s(me)
    per_thread: dict = {}
    for key, ns in thread_cpu_ns(main.pid).items():
        per_thread[key[1]] = per_thread.get(key[1], 0) + ns - threads_before.get(key, 0)
    http, sch, client = (a - b for a, b in zip(after, before))
    return {"requests": n, "tokens": tokens, "chunks": chunks, "wall_s": wall, "http_cpu_s": http,
            "sched_cpu_s": sch, "client_cpu_s": client, "http_us_per_token": 1e6 * http / max(tokens, 1),
            "http_us_per_request": 1e6 * http / n, "sched_us_per_token": 1e6 * sch / max(tokens, 1),
            "tok_s": tokens / wall, "threads_s": {k: v / 1e9 for k, v in per_thread.items() if v > 0}}


# the server under cProfile: SIGUSR1 starts profiling its event-loop thread, SIGUSR2 writes the stats to argv[1]
PROFILED_SERVER = """
import cProfile, signal, sys
from sglang.srt.entrypoints.http_server import launch_server
from sglang.srt.server_args import prepare_server_args
out, prof = sys.argv[1], cProfile.Profile()
signal.signal(signal.SIGUSR1, lambda *a: prof.enable())
signal.signal(signal.SIGUSR2, lambda *a: (prof.disable(), prof.dump_stats(out)))
launch_server(prepare_server_args(sys.argv[2:]))
"""


def run_http(args, server_flags: List[str]) -> None:
    import signal

    import requests

    from sglang.test.test_utils import DEFAULT_SMALL_SERVER_ARGS, popen_launch_server

    command = [sys.executable, "-c", PROFILED_SERVER, args.cprofile] if args.cprofile else None
    server = popen_launch_server(other_args=[*DEFAULT_SMALL_SERVER_ARGS, *server_flags], command=command)
    try:
        model = requests.get(f"{server.base_url}/v1/models", timeout=10).json()["data"][0]["id"]
        print(f"server ready in {server.startup_s:.1f} s; HTTP process pid {server.process.pid}")
        measure_http(server, model, args.concurrency, args.concurrency, 8, seed=1)  # warm-up
        seed = int(time.time())
        for r in range(args.repeat):
            one = measure_http(server, model, args.num_requests, args.concurrency, 1, seed=seed + 2 * r)
            spy = None
            if args.py_spy:  # sample the HTTP process's stacks during the measured run (pip install py-spy)
                import subprocess

                spy = subprocess.Popen(["py-spy", "record", "--pid", str(server.process.pid), "--rate", "500",
                                        "--format", "raw", "--output", f"{args.py_spy}.{r + 1}.txt", "--nonblocking"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(1.0)
            if args.cprofile:
                os.kill(server.process.pid, signal.SIGUSR1)
            res = measure_http(server, model, args.num_requests, args.concurrency, args.max_tokens,
                               seed=seed + 2 * r + 1)
            if args.cprofile:
                os.kill(server.process.pid, signal.SIGUSR2)
                time.sleep(1.0)
                pstats.Stats(args.cprofile).sort_stats(args.profile_sort).print_stats(45)
            if spy is not None:
                spy.send_signal(2)
                spy.wait()
            per_token = 1e6 * (res["http_cpu_s"] - one["http_cpu_s"]) / max(res["tokens"] - one["tokens"], 1)
            print(f"run {r + 1}: {res['requests']} x {args.max_tokens} tokens, c={args.concurrency}: "
                  f"{res['tokens']} tokens in {res['wall_s']:.2f} s ({res['tok_s']:.0f} tok/s), "
                  f"{res['chunks']} chunks with a choice ({res['chunks'] / max(res['tokens'], 1):.2f} per token)")
            print(f"    HTTP process CPU {res['http_cpu_s']:.3f} s = {res['http_us_per_token']:.0f} us/token "
                  f"(all in); 1-token requests: {one['http_us_per_request']:.0f} us/request; "
                  f"per streamed token beyond the request: {per_token:.0f} us")
            threads = sorted(res["threads_s"].items(), key=lambda kv: -kv[1])
            print("    HTTP process threads: " + ", ".join(f"{name} {sec:.3f} s" for name, sec in threads))
            print(f"    scheduler process CPU {res['sched_cpu_s']:.3f} s = {res['sched_us_per_token']:.0f} us/token "
                  f"(forward included); this client {res['client_cpu_s']:.3f} s")
    finally:
        server.kill()


# ====================================================================== step
class StubForward:
    """Replaces ModelRunner.forward: one-hot logits picking each request's next token from TEXT's tokens. The logits
    live in one buffer kept between steps (greedy sampling only reads them), so neither allocating nor freeing
    [B, vocab] floats is counted outside the forward."""

    def __init__(self, runner, text_ids: List[int]):
        self.real = runner.forward
        self.vocab = runner.model_config.vocab_size
        self.text_ids = text_ids
        self.seconds = 0.0
        self.buffers = {}  # batch size -> (logits, the columns set to 1)

    def __call__(self, fb):
        import torch

        t0 = time.perf_counter()
        n, b = len(self.text_ids), fb.batch_size
        toks = torch.tensor([self.text_ids[(s + 7 * r) % n] for s, r in zip(fb.seq_lens_cpu, fb.req_pool_indices_cpu)])
        logits, hot = self.buffers.get(b) or (torch.zeros(b, self.vocab, dtype=torch.float32), None)
        rows = torch.arange(b)
        if hot is not None:
            logits[rows, hot] = 0.0
        logits[rows, toks] = 1.0
        self.buffers[b] = (logits, toks)
        self.seconds += time.perf_counter() - t0
        return logits


class Timed:
    def __init__(self, fn):
        self.fn, self.seconds = fn, 0.0

    def __call__(self, *a, **kw):
        t0 = time.perf_counter()
        try:
            return self.fn(*a, **kw)
        finally:
            self.seconds += time.perf_counter() - t0


def run_step(args) -> None:
    import zmq

    import sglang.srt.managers.batch_runner as batch_runner
    from sglang.srt.managers.io_struct import BatchReqOutput, TokenizedGenerateReqInput
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.server_args import ServerArgs

    max_b = max(args.batch_sizes)
    prompt_len, out_len = 32, args.steps + 2
    sa = ServerArgs(max_running_requests=max_b, max_total_tokens=max_b * (prompt_len + out_len + 8) + 1024,
                    chunked_prefill_size=8192, disable_radix_cache=True)
    scheduler = Scheduler(sa)
    try:  # what the scheduler process does after its warmup, where the runtime does it
        from sglang.srt.utils.gc_freeze import freeze_startup_heap

        freeze_startup_heap()
    except ImportError:
        pass
    tok = scheduler.tokenizer
    stub = StubForward(scheduler.model_runner, tok.encode(TEXT, add_special_tokens=False))
    scheduler.model_runner.forward = stub
    sample = Timed(batch_runner.sample)
    batch_runner.sample = sample
    ctx = zmq.Context()
    endpoint = f"ipc:///tmp/bench-stream-{os.getpid()}"
    pull = ctx.socket(zmq.PULL)
    pull.bind(endpoint)
    push = ctx.socket(zmq.PUSH)
    push.connect(endpoint)
    rng = random.Random(0)
    print(f"default model, vocab {stub.vocab}; each request: {prompt_len} prompt tokens, stream=True")
    for b in args.batch_sizes:
        for _ in range(b):
            ids = [rng.randrange(100, 10000) for _ in range(prompt_len)]
            sp = SamplingParams.from_dict({"temperature": 0, "max_new_tokens": out_len, "ignore_eos": True})
            scheduler.add_request(TokenizedGenerateReqInput(f"r{rng.random()}", None, ids, sp, stream=True))
        while scheduler.waiting_queue or scheduler.chunked_req is not None:  # prefill (stub forward)
            push.send_pyobj(BatchReqOutput(scheduler.step()))
        while pull.poll(0):
            pull.recv()
        prof = cProfile.Profile() if args.profile else None
        times, fwd, smp, nbytes = [], [], [], 0
        for i in range(args.steps):
            f0, s0 = stub.seconds, sample.seconds
            if prof is not None:
                prof.enable()
            t0 = time.perf_counter()
            outputs = scheduler.step()
            if outputs:
                push.send_pyobj(BatchReqOutput(outputs))
            times.append(time.perf_counter() - t0)
            if prof is not None:
                prof.disable()
            fwd.append(stub.seconds - f0)
            smp.append(sample.seconds - s0)
            while pull.poll(0):
                nbytes += len(pull.recv())
            assert len(outputs) == b, (len(outputs), b)
        outside = [t - f - s for t, f, s in zip(times, fwd, smp)]
        med = statistics.median(outside)
        print(f"batch {b:4d}: outside forward+sample {1e3 * med:7.3f} ms/step (median of {args.steps}; "
              f"min {1e3 * min(outside):.3f}) = {1e6 * med / b:6.1f} us/request; sample "
              f"{1e3 * statistics.median(smp):.3f} ms; stub forward {1e3 * statistics.median(fwd):.3f} ms; "
              f"message {nbytes / args.steps / b:.0f} B/request")
        if prof is not None:
            pstats.Stats(prof).sort_stats(args.profile_sort).print_stats(40)
        while scheduler.has_work():  # finish them
            scheduler.step()
    push.close(0)
    pull.close(0)
    ctx.term()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    h = sub.add_parser("http")
    h.add_argument("-n", "--num-requests", type=int, default=64)
    h.add_argument("-c", "--concurrency", type=int, default=32)
    h.add_argument("--max-tokens", type=int, default=64)
    h.add_argument("--repeat", type=int, default=1)
    h.add_argument("--py-spy", metavar="PREFIX", help="record the HTTP process's stacks to PREFIX.<run>.txt")
    h.add_argument("--cprofile", metavar="FILE", help="cProfile the HTTP process's event loop during the run")
    h.add_argument("--profile-sort", default="tottime", help="pstats sort key")
    s = sub.add_parser("step")
    s.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32, 256])
    s.add_argument("--steps", type=int, default=48)
    s.add_argument("--profile", action="store_true", help="cProfile the timed steps")
    s.add_argument("--profile-sort", default="tottime", help="pstats sort key")
    args, rest = p.parse_known_args()
    if args.what == "http":
        run_http(args, rest)
    else:
        if rest:
            p.error(f"unknown arguments {rest}")
        run_step(args)


if __name__ == "__main__":
    sys.exit(main())

"""The overlap schedule (managers/overlap_worker.py) changes no token: a mixed workload through sglang.Engine in
float32 gives the same tokens, text and finish reasons with the overlap on and off — greedy, stop strings, penalties
(frequency / presence / repetition), max_tokens 1-3, min_new_tokens, seeded sampling, n > 1, a regex grammar, a
chunked prompt, prefix-cache hits on a second pass and retraction under a small pool — and so do aborts mid-stream
and injected faults. Memory is intact and idle after every test. The same through the HTTP server (the scheduler in
its own process with the overlap on) under concurrent load, against the overlap-off engine.

One engine serves both sides: the overlap is swapped out (scheduler.overlap = None) while the engine is idle.
"""

import contextlib
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from sglang import Engine
from sglang.srt.managers.fault_injection import FaultInjector, parse_rules
from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs
from sglang.srt.managers.overlap_worker import overlap_enabled
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import PROMPTS, assert_idle_and_intact, shutdown

register_cpu_ci(est_time=130, suite="cpu")

LONG_PROMPT = "Here is a long story about a cat who sails to the moon. " * 14  # > chunked_prefill_size tokens


def mixed_workload():
    """(prompts, sampling params): every feature whose state the overlap's one-step lag could disturb."""
    g = {"temperature": 0}
    cases = [
        (PROMPTS[0], dict(g, max_new_tokens=24, ignore_eos=True)),
        (PROMPTS[1], dict(g, max_new_tokens=40, stop=["\n", " return"])),
        (PROMPTS[2], dict(g, max_new_tokens=40, stop=[" the", "."])),
        (PROMPTS[3], dict(g, max_new_tokens=30, frequency_penalty=0.6, presence_penalty=0.4)),
        (PROMPTS[4], dict(g, max_new_tokens=30, repetition_penalty=1.4, stop=[","])),
        (PROMPTS[5], dict(g, max_new_tokens=1)),
        (PROMPTS[6], dict(g, max_new_tokens=2)),
        (PROMPTS[7], dict(g, max_new_tokens=3, stop=["np"])),
        (PROMPTS[0], dict(g, max_new_tokens=20, min_new_tokens=12, stop=[" and"])),
        (PROMPTS[2], {"temperature": 0.9, "top_p": 0.9, "seed": 7, "max_new_tokens": 24}),
        ("Serial number:", dict(g, max_new_tokens=16, regex="[0-9]{3}-[a-z]{4}")),
        (LONG_PROMPT, dict(g, max_new_tokens=24, stop=["moon"])),
        (PROMPTS[1], dict(g, max_new_tokens=40, stop_regex=[r"\n\s*\n", r"[rR]et[a-z]+"])),  # issue 28's stop_regex
    ]
    # first in the queue: these outgrow the pool together, so requests are retracted
    cases = [(PROMPTS[i] + f" (request {i})", dict(g, max_new_tokens=60, ignore_eos=True)) for i in range(6)] + cases
    return [c[0] for c in cases], [c[1] for c in cases]


def summary(out):
    return out["output_ids"], out["text"], out["meta_info"]["finish_reason"]


@pytest.fixture(scope="module")
def engine():
    # a small pool: the workload (x2 for n) does not fit at once, so requests are retracted and re-prefilled
    e = Engine(dtype="float32", max_total_tokens=320, chunked_prefill_size=128, enable_overlap_schedule=True,
               log_level="warning")
    yield e
    shutdown(e)


@pytest.fixture(autouse=True)
def intact_after(engine):
    yield
    assert engine.scheduler.overlap is not None
    assert_idle_and_intact(engine)
    assert engine.scheduler.overlap.num_pending() == 0


@contextlib.contextmanager
def overlap_off(engine):
    s = engine.scheduler
    assert not s.has_work()
    saved, s.overlap = s.overlap, None
    try:
        yield
    finally:
        s.overlap = saved


# the overlap-off engine's first pass of the workload from a flushed cache: test_mixed_workload_tokens_identical's
# reference, reused by test_server_concurrent_mixed_workload (the same engine, state and requests: the same tokens)
OFF_FIRST_PASS = []


def first_pass(engine):
    prompts, params = mixed_workload()
    engine.flush_cache()
    return [summary(o) for o in engine.generate(prompts, params)]


def two_passes(engine):
    """The workload twice (the second pass hits the prefix cache), then with n=2; flushes the cache first."""
    prompts, params = mixed_workload()
    first = first_pass(engine)
    second = engine.generate(prompts, params)
    multi = engine.generate(PROMPTS[1], {"temperature": 0, "max_new_tokens": 20, "n": 2, "stop": ["\n"]})
    return first, [summary(o) for o in second], [summary(o) for o in multi], second


def test_defaults_and_flags():
    assert overlap_enabled(ServerArgs(), "cpu") is False  # measured: no gain on CPU
    assert overlap_enabled(ServerArgs(), "cuda") is False  # not measured there yet
    assert overlap_enabled(ServerArgs(enable_overlap_schedule=True), "cpu") is True
    assert overlap_enabled(ServerArgs(disable_overlap_schedule=True), "cpu") is False
    with pytest.raises(ValueError, match="tp-size"):
        ServerArgs(enable_overlap_schedule=True, tp_size=2)
    with pytest.raises(ValueError, match="contradict"):
        ServerArgs(enable_overlap_schedule=True, disable_overlap_schedule=True)


def test_mixed_workload_tokens_identical(engine):
    s = engine.scheduler
    assert len(engine.tokenizer.encode(LONG_PROMPT)) > s.chunked_prefill_size
    with overlap_off(engine):
        retractions = s.num_retractions
        ref = two_passes(engine)
        assert s.num_retractions > retractions, "the pool is meant to force retraction"
    OFF_FIRST_PASS[:] = ref[0]
    steps, dropped, retractions = s.overlap.num_overlapped_steps, s.overlap.num_dropped_tokens, s.num_retractions
    got = two_passes(engine)
    for a, b in zip(got[:3], ref[:3]):
        assert a == b
    assert s.num_retractions > retractions
    assert s.overlap.num_overlapped_steps > steps + 30
    assert s.overlap.num_dropped_tokens > dropped  # stop strings found a step late: their extra token was dropped
    assert sum(o["meta_info"]["cached_tokens"] for o in got[3]) > 0
    finish = [r[2]["type"] for r in got[0]]
    assert "stop" in finish and "length" in finish


def flatten(entries):
    """(logprob, token id) pairs of output_token_logprobs ([lp, id, text]) or output_top_logprobs (lists of them)."""
    out = []
    for e in entries:
        out.extend(flatten(e) if e and isinstance(e[0], list) else [(e[0], e[1])])
    return out


def test_logprobs_and_streaming_identical(engine):
    kw = dict(return_logprob=True, top_logprobs_num=3)
    params = {"temperature": 0, "max_new_tokens": 12, "stop": [" the"]}
    with overlap_off(engine):
        engine.flush_cache()  # the same prefix-cache state on both sides: logprobs compare exactly
        ref = engine.generate(PROMPTS[:3], params, **kw)
        ref_stream = [c["text"] for c in engine.generate(PROMPTS[2], params, stream=True)]
    engine.flush_cache()
    got = engine.generate(PROMPTS[:3], params, **kw)
    for a, b in zip(got, ref):
        assert summary(a) == summary(b)
        # a request a stop string ends runs one more (dropped) step with the overlap, so later steps' batches differ
        # in size for a step; float32 logits then differ in the last bits, so logprobs compare to 1e-4
        for key in ("output_token_logprobs", "output_top_logprobs"):
            flat_a, flat_b = flatten(a["meta_info"][key]), flatten(b["meta_info"][key])
            assert [t for _, t in flat_a] == [t for _, t in flat_b]
            assert [v for v, _ in flat_a] == pytest.approx([v for v, _ in flat_b], abs=1e-4)
    assert [c["text"] for c in engine.generate(PROMPTS[2], params, stream=True)][-1] == ref_stream[-1]


def test_abort_mid_stream(engine):
    params = {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True}
    with overlap_off(engine):
        ref = engine.generate(PROMPTS[3], params)["text"]
    stream = engine.generate(PROMPTS[3], params, stream=True)
    chunks = [next(stream)["text"] for _ in range(4)]
    stream.close()  # aborts the request
    assert ref.startswith(chunks[-1]) and chunks[-1]


def run_rids(engine, rids, prompts, spec=None, abort_at=None, max_new=10):
    """Queue requests under these rids and step until idle; abort_at=(step, rid) aborts one on the way."""
    s = engine.scheduler
    if spec is not None:
        s.faults = FaultInjector(parse_rules(spec))
    for rid, p in zip(rids, prompts):
        sp = SamplingParams.from_dict({"temperature": 0, "max_new_tokens": max_new, "stop": [" zebra"]})
        s.add_request(TokenizedGenerateReqInput(rid, p, engine.tokenizer.encode(p), sp))
    res, n = {}, 0
    while s.has_work():
        n += 1
        if abort_at is not None and n == abort_at[0]:
            s.abort_request(abort_at[1])
        for o in s.step():
            ids, text, _ = res.get(o.rid, ([], "", None))
            res[o.rid] = (ids + o.new_token_ids, text + o.new_text, o.finish_reason)
    s.faults = None
    return res


def test_abort_and_faults_confined(engine):
    rids = ["ok0", "victim-decode", "ok1", "victim-detokenize", "ok2", "victim-sample", "aborted"]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(rids))]
    with overlap_off(engine):
        ref = run_rids(engine, rids, prompts)
    spec = "decode:error:rid=victim-decode;detokenize:error:rid=victim-detokenize;sample:error:rid=victim-sample"
    got = run_rids(engine, rids, prompts, spec=spec, abort_at=(5, "aborted"))
    for rid in ("ok0", "ok1", "ok2"):
        assert got[rid] == ref[rid]
    for step in ("decode", "detokenize", "sample"):
        reason = got[f"victim-{step}"][2]
        assert reason["type"] == "abort" and reason["status_code"] == 500 and step in reason["message"], reason
    ab_ids, ab_text, ab_reason = got["aborted"]
    assert ab_reason["type"] == "abort" and "status_code" not in ab_reason
    assert ref["aborted"][0][: len(ab_ids)] == ab_ids and 0 < len(ab_ids) < len(ref["aborted"][0])
    assert ref["aborted"][1].startswith(ab_text)
    assert engine.scheduler.num_memory_repairs == 0


# ---------------------------------------------------------------------------------------------------- HTTP server
@pytest.fixture(scope="module")
def server():
    from sglang.test.test_utils import DEFAULT_SMALL_SERVER_ARGS, popen_launch_server

    spec = "decode:error:rid=victim-decode;detokenize:error:rid=victim-detokenize"
    s = popen_launch_server(other_args=[*DEFAULT_SMALL_SERVER_ARGS, "--dtype", "float32",
                                        "--enable-overlap-schedule"], env={"SGLANG_FAULT_INJECT": spec})
    yield s
    s.kill()


def test_server_concurrent_mixed_workload(engine, server):
    """The scheduler in its own process, outputs sent and requests read during the forward: concurrent requests
    give the overlap-off engine's tokens; injected faults fail only their request; memory is intact after."""
    import requests

    prompts, params = mixed_workload()
    if not OFF_FIRST_PASS:  # this test run alone
        with overlap_off(engine):
            OFF_FIRST_PASS[:] = first_pass(engine)
    ref = OFF_FIRST_PASS

    def post(i):
        body = {"text": prompts[i], "sampling_params": params[i], "rid": f"r{i}"}
        return requests.post(f"{server.base_url}/generate", json=body, timeout=300)

    def victim(step):
        body = {"text": PROMPTS[0], "sampling_params": {"temperature": 0, "max_new_tokens": 8}, "rid": f"victim-{step}"}
        return requests.post(f"{server.base_url}/generate", json=body, timeout=300)

    def stream_and_drop():
        body = {"text": PROMPTS[3], "sampling_params": {"temperature": 0, "max_new_tokens": 200, "ignore_eos": True},
                "stream": True}
        with requests.post(f"{server.base_url}/generate", json=body, stream=True, timeout=300) as r:
            lines = r.iter_lines()
            return [next(lines) for _ in range(6)]  # then disconnect: the server aborts the request

    with ThreadPoolExecutor(len(prompts) + 3) as pool:
        futs = [pool.submit(post, i) for i in range(len(prompts))]
        bad = [pool.submit(victim, step) for step in ("decode", "detokenize")]
        dropped = pool.submit(stream_and_drop)
        got = [f.result() for f in futs]
        assert all(r.status_code == 200 for r in got), [r.text for r in got if r.status_code != 200]
        assert [summary(r.json()) for r in got] == ref
        for f, step in zip(bad, ("decode", "detokenize")):
            r = f.result()
            assert r.status_code == 500 and step in r.text, r.text
        assert len(dropped.result()) == 6

    deadline = time.time() + 60
    while True:  # the dropped stream's abort reaches the scheduler shortly after the disconnect
        requests.post(f"{server.base_url}/flush_cache", timeout=30)
        info = requests.get(f"{server.base_url}/server_info", timeout=30).json()
        state = info["internal_states"][0]
        if state["num_used_tokens"] == 0 and state["num_running_reqs"] == 0 or time.time() > deadline:
            break
        time.sleep(0.5)
    assert info["memory_integrity"] == "ok"
    assert state["num_used_tokens"] == 0 and state["num_running_reqs"] == 0
    assert server.process.poll() is None


def test_forward_stays_on_the_scheduler_thread_and_errors_come_back_in_order():
    """The forward runs on the calling (scheduler) thread, which owns the process's only OpenMP team; the window
    (text halves, the process loop's messages) on the helper thread. A window error is raised after the forward,
    a forward error wins over it, and both leave the helper ready for the next step."""
    import threading
    from types import SimpleNamespace

    from sglang.srt.managers.overlap_worker import OverlapSchedule

    ov = OverlapSchedule(SimpleNamespace())  # no queued text: the window touches only its hook
    seen = {}

    def hook():
        seen["window"] = threading.current_thread()

    def job():
        seen["forward"] = threading.current_thread()
        return 7

    ov.window_hook = hook
    try:
        assert ov.run(job) == 7
        assert seen["forward"] is threading.current_thread()
        assert seen["window"] is not threading.current_thread()

        def bad_hook():
            raise OSError("socket gone")

        def bad_job():
            raise RuntimeError("forward failed")

        ov.window_hook = bad_hook
        with pytest.raises(OSError, match="socket gone"):
            ov.run(job)
        with pytest.raises(RuntimeError, match="forward failed"):
            ov.run(bad_job)
        ov.window_hook = hook
        assert ov.run(job) == 7 and ov.num_overlapped_steps == 4
    finally:
        ov.shutdown()
    assert not seen["window"].is_alive()

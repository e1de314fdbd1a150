"""Fault confinement in the in-process scheduler (sglang.Engine), driven by SGLANG_FAULT_INJECT.

For each step (prefill, decode, sample, detokenize) an injected fault fails only the request it targets, with a
500 abort naming the step; the other requests of the same batches finish with the tokens of a fault-free run
(greedy fp32), memory is intact and nothing stays allocated. An injected OOM in decode under load is survived by
retraction with identical outputs; a request that OOMs even alone fails alone; a broken free list is repaired; a
state that cannot be repaired stops the step with SchedulerStateCorrupt.
"""

import pytest

from sglang import Engine
from sglang.srt.managers.fault_confinement import SchedulerStateCorrupt
from sglang.srt.managers.fault_injection import ENV_VAR, FaultInjector, parse_rules
from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import PROMPTS, shutdown

register_cpu_ci(est_time=20, suite="cpu")

MAX_NEW = 8


@pytest.fixture(scope="module")
def engine():
    mp = pytest.MonkeyPatch()
    # read once at construction: this rule must be live in the engine's scheduler
    mp.setenv(ENV_VAR, "decode:error:rid=envvictim")
    e = Engine(dtype="float32", max_total_tokens=4096, max_running_requests=32, chunked_prefill_size=256,
               log_level="critical")
    mp.undo()
    yield e
    shutdown(e)


def run(engine, rids, prompts, spec=None, max_new=MAX_NEW, repairs=0):
    """Queue the prompts under these rids, step until idle; {rid: (output_ids, finish_reason)}.

    `repairs`: how many free-list rebuilds the run may need. A confined fault frees its requests' memory itself, so
    the integrity check after it passes without a rebuild (a rebuild would hide a leak in the cleanup path)."""
    s = engine.scheduler
    repairs_before = s.num_memory_repairs
    if spec is not None:
        s.faults = FaultInjector(parse_rules(spec))
    tok = engine.tokenizer
    for rid, p in zip(rids, prompts):
        sp = SamplingParams.from_dict({"temperature": 0, "max_new_tokens": max_new, "ignore_eos": True})
        s.add_request(TokenizedGenerateReqInput(rid, p, tok.encode(p), sp))
    res = {}
    while s.has_work():
        for o in s.step():
            ids, _ = res.get(o.rid, ([], None))
            res[o.rid] = (ids + o.new_token_ids, o.finish_reason)
    s.faults = None
    s.check_integrity()
    assert s.get_stats()["num_used_tokens"] == 0
    assert s.num_memory_repairs - repairs_before == repairs
    assert not s.reqs and not s.running and s.chunked_req is None
    return res


@pytest.fixture(scope="module")
def reference(engine):
    out = run(engine, [f"ref{i}" for i in range(len(PROMPTS))], PROMPTS)
    return [out[f"ref{i}"][0] for i in range(len(PROMPTS))]


def assert_only_victim_failed(res, rids, reference, step):
    for i, rid in enumerate(rids):
        ids, fr = res[rid]
        if "victim" in rid:
            assert fr["type"] == "abort" and fr["status_code"] == 500, fr
            assert f"The {step} step failed" in fr["message"] and "injected fault" in fr["message"], fr
        else:
            assert fr == {"type": "length", "length": MAX_NEW}, (rid, fr)
            assert ids == reference[i], f"{rid} changed its output after a {step} fault"


@pytest.mark.parametrize("step", ["prefill", "decode", "sample", "detokenize"])
def test_injected_error_fails_only_its_request(engine, reference, step):
    rids = [f"{step}-{i}" for i in range(len(PROMPTS))]
    rids[3] = f"{step}-victim"
    res = run(engine, rids, PROMPTS, spec=f"{step}:error:rid=victim")
    assert_only_victim_failed(res, rids, reference, step)
    # the engine keeps working for the next call
    out = engine.generate(PROMPTS[0], {"temperature": 0, "max_new_tokens": MAX_NEW, "ignore_eos": True})
    assert out["output_ids"] == reference[0]


def test_scheduled_fault_fails_one_request_per_firing(engine, reference):
    rids = [f"sched-{i}" for i in range(len(PROMPTS))]
    res = run(engine, rids, PROMPTS, spec="decode:error:at=3")
    failed = [r for r in rids if res[r][1]["type"] == "abort"]
    assert len(failed) == 1 and "The decode step failed" in res[failed[0]][1]["message"]
    assert len(res[failed[0]][0]) == 3  # prefill and two decode batches gave it 3 tokens; the 3rd decode failed
    for i, r in enumerate(rids):
        if r not in failed:
            assert res[r][0] == reference[i]


def test_fault_injection_env_var_is_read_at_construction(engine, reference):
    s = engine.scheduler
    saved = FaultInjector(parse_rules("decode:error:rid=envvictim"))
    s.faults = saved  # the same rule the fixture put in the environment, re-armed after the tests above cleared it
    res = run(engine, ["env-a", "envvictim-b"], PROMPTS[:2])
    assert res["env-a"][0] == reference[0]
    assert res["envvictim-b"][1]["status_code"] == 500


def test_engine_generate_returns_the_abort(engine, reference):
    engine.scheduler.faults = FaultInjector(parse_rules("sample:error:at=1"))
    out = engine.generate(PROMPTS[:2], {"temperature": 0, "max_new_tokens": MAX_NEW, "ignore_eos": True})
    engine.scheduler.faults = None
    reasons = [o["meta_info"]["finish_reason"] for o in out]
    assert reasons[0]["type"] == "abort" and reasons[0]["status_code"] == 500
    assert "The sample step failed" in reasons[0]["message"]
    assert out[1]["output_ids"] == reference[1]


def test_decode_oom_under_load_is_survived_by_retraction(engine):
    prompts = [PROMPTS[i % len(PROMPTS)] + f" {i}" for i in range(16)]
    rids = [f"load-{i}" for i in range(16)]
    base = run(engine, [f"base-{i}" for i in range(16)], prompts, max_new=12)
    retractions = engine.scheduler.num_retractions
    res = run(engine, rids, prompts, spec="decode:oom:at=4", max_new=12)
    assert engine.scheduler.num_retractions >= retractions + 8  # half of the 16-request batch went back
    for i, rid in enumerate(rids):
        assert res[rid][1] == {"type": "length", "length": 12}
        assert res[rid][0] == base[f"base-{i}"][0], f"{rid} changed its output after retraction"
    engine.scheduler.oom_cap.value = None


@pytest.mark.parametrize("step", ["prefill", "decode"])
def test_request_that_ooms_even_alone_fails_alone(engine, reference, step):
    rids = [f"oom{step}-{i}" for i in range(4)]
    rids[1] = f"oom{step}-victim"
    res = run(engine, rids, PROMPTS[:4], spec=f"{step}:oom:rid=victim")
    fr = res[rids[1]][1]
    assert fr["status_code"] == 500 and "OutOfMemoryError" in fr["message"] and step in fr["message"]
    for i in (0, 2, 3):
        assert res[rids[i]][0] == reference[i]
    engine.scheduler.oom_cap.value = None


def test_prefill_oom_halves_the_chunk(engine):
    prompt = [PROMPTS[5] + " apples, pears and plums; then a long list of other fruit names"]
    base = run(engine, ["whole-0"], prompt)["whole-0"][0]
    assert engine.flush_cache()  # the retry must prefill the whole prompt again, not a cached prefix
    faults_before = engine.scheduler.num_faults
    res = run(engine, ["half-0"], prompt, spec="prefill:oom:at=1")  # the first prefill batch OOMs once
    assert engine.scheduler.num_faults == faults_before + 1  # one OOM, then the two halves went through
    assert res["half-0"] == (base, {"type": "length", "length": MAX_NEW})


def test_leaked_page_is_repaired(engine, reference):
    s = engine.scheduler
    s.allocator.free_pages.pop()  # a page that no one owns: a leak the integrity check sees
    with pytest.raises(AssertionError):
        s.check_integrity()
    res = run(engine, ["repair-0", "repair-victim"], PROMPTS[:2], spec="decode:error:rid=victim", repairs=1)
    assert res["repair-0"][0] == reference[0]  # the fault triggered the check, which rebuilt the free list


def test_unrepairable_state_raises(engine):
    s = engine.scheduler
    s.faults = FaultInjector(parse_rules("decode:error:rid=victim"))
    tok = engine.tokenizer
    sp = SamplingParams.from_dict({"temperature": 0, "max_new_tokens": 4})
    s.add_request(TokenizedGenerateReqInput("corrupt-victim", "x", tok.encode(PROMPTS[0]), sp))
    s.step()  # prefill
    s.tree_cache._evictable += 1  # radix accounting drift: not something a free-list rebuild can fix
    with pytest.raises(SchedulerStateCorrupt):
        s.step()
    s.tree_cache._evictable -= 1
    s.faults = None
    s.check_integrity()

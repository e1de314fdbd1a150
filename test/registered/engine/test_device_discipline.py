"""Device discipline of prefill and decode steps, checked on a CPU: what the first GPU would punish, caught here.

Every planned buffer and pool sits on the `meta` device (the GPU stand-in) and the host bookkeeping is real;
sglang.test.device_discipline.DeviceDiscipline applies CUDA's rules: an op mixing device and host tensors raises, an
op with a data-dependent output shape raises, and every read of device values by the host (a sync) is counted with
its line. One test per part of a step (grammar mask, page table, request-table writes, KV writes, logits), then whole
scheduler steps -- batch building, the model's forward, attention metadata, sampling, commit -- through the real
Scheduler over a model runner on the stand-in device (sglang.test.meta_runner), with the sync budget of the issue:
at most one device-to-host copy per step (the sampled tokens with their logprobs). The sampler's own parts are
checked in test/registered/sampling/test_sampler_device_discipline.py.
"""

from types import SimpleNamespace

import pytest
import torch

from sglang.srt.constrained.logits_mask import apply_grammar_mask_
from sglang.srt.constrained.request_grammar import RequestGrammar
from sglang.srt.constrained.token_bitmask import TokenBitmask
from sglang.srt.layers.attention.paged_kv_indices import build_page_table
from sglang.srt.layers.logits_processor import LogitsProcessor
from sglang.srt.layers.vocab_embedding import ParallelLMHead
from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.managers.req_memory import ReqMemory
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode, move_to_device
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.device_discipline import DataDependentOp, DeviceDiscipline, DeviceMismatch

register_cpu_ci(est_time=30, suite="cpu")

xgr = pytest.importorskip("xgrammar")
META = "meta"
VOCAB = ["<eos>", "a", "b", "ab", "{", "}", '"', "1", "2", " ", "x", "yes", "no", "12", "ba"]


# ---------------------------------------------------------------------------------------------- the harness itself
def test_harness_catches_what_cuda_refuses():
    """The stand-in rules fail where CUDA fails: a host index into a device gather, nonzero on the device, a read."""
    table = torch.zeros(256, 8, device=META)
    with DeviceDiscipline() as dd:
        with pytest.raises(DeviceMismatch, match="index_select"):
            torch.index_select(table, 0, torch.arange(4))
        with pytest.raises(DataDependentOp, match="nonzero"):
            torch.nonzero(table)
        table.max(dim=-1).indices.tolist()
        table[torch.tensor([1, 2])] = 0.0  # a host index into a device tensor is fine on CUDA too
    assert [s.op for s in dd.syncs] == ["nonzero", "_to_copy"]


# ---------------------------------------------------------------------------------------------- grammar mask
@pytest.fixture(scope="module")
def compiler():
    info = xgr.TokenizerInfo(VOCAB, stop_token_ids=[0])
    return xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)


def _req(grammar=None):
    return SimpleNamespace(grammar=grammar, sampling_params=SamplingParams(), output_ids=[])


@pytest.mark.parametrize("constrained", [(0, 2), (0, 1, 2, 3)], ids=["some-rows", "every-row"])
def test_grammar_mask_on_the_device(compiler, constrained):
    """The matchers fill the host rows, one upload moves them to the planned device rows, the mask and the dead-row
    fallback are device ops: no mismatch, no sync. (Before: the device byte table was indexed with host byte ids ->
    DeviceMismatch, and dead rows were found with nonzero().tolist().)"""
    reqs = []
    for i in range(4):
        g = RequestGrammar("regex", xgr.GrammarMatcher(compiler.compile_regex("(ab|a)+b")), lambda: None)
        reqs.append(_req(g if i in constrained else None))
    bitmask = TokenBitmask(8, len(VOCAB), META)
    assert bitmask.device.device.type == META and bitmask.host.device.type == "cpu"
    logits = torch.zeros(4, len(VOCAB), device=META)
    with DeviceDiscipline() as dd:
        apply_grammar_mask_(logits, reqs, bitmask)
    assert dd.syncs == [], dd.report()
    assert dd.h2d_copies >= 1  # the rows' upload
    allowed = {1, 3}  # "a", "ab": what the regex allows first (the host rows the matchers filled)
    host_bits = bitmask.host[list(constrained)]
    assert all({t for t in range(len(VOCAB)) if row[t // 32] >> (t % 32) & 1} == allowed for row in host_bits)


# ---------------------------------------------------------------------------------------------- page table
@pytest.mark.parametrize("page_size", [1, 16])
def test_page_table_goes_into_the_planned_buffers(page_size):
    """FlashInfer/AITER's CSR arrays for an extend and a decode batch: every array is a view of a planned device
    buffer, the page ids are gathered into one without a [B, max_pages] temporary, and nothing is read back.
    (Before: a [B, max_pages] gather and a boolean-mask select, a data-dependent op, every step.)"""
    pool = ReqToTokenPool(4, 512, META)
    rows = [pool.alloc(), pool.alloc()]
    for row, n in zip(rows, (40, 300)):
        pool.write(row, 0, list(range(page_size * row * 1000, page_size * row * 1000 + n)))
    pool.sync_to_device()
    bufs = {name: torch.empty(n, dtype=torch.int32, device=META)
            for name, n in (("kv_indptr", 5), ("last", 5), ("qo", 5), ("kv_indices", 4 * 512))}
    with DeviceDiscipline() as dd:
        for extend in (True, False):
            seq_lens = [40, 300] if extend else [41, 301]
            t = build_page_table(pool.req_to_token, torch.tensor(rows).to(META), seq_lens, page_size,
                                 bufs["kv_indptr"], bufs["last"], bufs["kv_indices"], rows,
                                 extend_lens_cpu=[40, 300] if extend else None, qo_indptr_buf=bufs["qo"])
            assert t.kv_indices._base is bufs["kv_indices"] and t.kv_indptr._base is bufs["kv_indptr"]
            assert len(t.kv_indices) == sum(-(-n // page_size) for n in seq_lens)
            assert t.kv_indptr_host.tolist()[-1] == len(t.kv_indices)  # the host copy plan() reads
    assert dd.syncs == [], dd.report()


# ---------------------------------------------------------------------------------------------- request table
def _memory(device, page_size=4, host_mirror=None):
    pool = ReqToTokenPool(4, 256, device, host_mirror=host_mirror)
    allocator = TokenToKVPoolAllocator(1024, page_size)
    return ReqMemory(pool, allocator, RadixCache(page_size, allocator.free), page_size)


def test_request_table_writes_never_read_the_device():
    """Admission with a cached prefix, chunked allocation that continues a partly filled page, release into the
    cache and the repair pass read and write rows on the host; the device table gets the writes in one scatter.
    (Before: the slot of a request's last token was read with int(req_to_token[...]) per allocation (page size >
    1) and a release read its row with .tolist(): a sync each.)"""
    mem = _memory(META)
    assert mem.req_to_token_pool.mirrored
    a = Req("a", list(range(1, 30)), SamplingParams(max_new_tokens=4))
    b = Req("b", list(range(1, 30)) + [99, 98], SamplingParams(max_new_tokens=4))
    with DeviceDiscipline() as dd:
        mem.admit(a, [], None)
        assert mem.alloc(a, 13) and mem.alloc(a, 16)  # the second continues a's partly filled page
        a.kv_len = 29
        mem.release(a, cache=True)
        prefix, node = mem.match_prefix(b)
        mem.admit(b, prefix, node)
        assert mem.alloc(b, len(b.fill_ids) - len(prefix))
        assert mem.req_to_token_pool.sync_to_device() > 0
        mem.rebuild_free_lists([b])
    assert dd.syncs == [], dd.report()
    mem.check_integrity([b])


def test_request_table_device_copy_equals_the_host_rows():
    """The same operations with a real second table (host_mirror on a CPU): after sync_to_device the device table
    holds exactly the host rows of every live request."""
    mem = _memory("cpu", host_mirror=True)
    pool = mem.req_to_token_pool
    reqs = [Req(str(i), list(range(1, 20 + 7 * i)), SamplingParams(max_new_tokens=4)) for i in range(3)]
    for r in reqs:
        mem.admit(r, [], None)
        mem.alloc(r, len(r.fill_ids))
    pool.sync_to_device()
    mem.alloc(reqs[1], 1)  # a decode step's slot, not yet synced
    row = reqs[1].req_pool_idx
    assert pool.req_to_token[row, reqs[1].alloc_len - 1] != pool.req_to_token_host[row, reqs[1].alloc_len - 1]
    pool.sync_to_device()
    for r in reqs:
        assert torch.equal(pool.req_to_token[r.req_pool_idx, : r.alloc_len],
                           pool.req_to_token_host[r.req_pool_idx, : r.alloc_len])


# ---------------------------------------------------------------------------------------------- KV writes, logits
def test_kv_writes_take_device_slots_only():
    kv = MHATokenToKVPool(64, 1, torch.bfloat16, 2, 16, 2, META)
    k = v = torch.zeros(3, 2, 16, dtype=torch.bfloat16, device=META)
    with DeviceDiscipline() as dd:
        kv.set_kv_buffer(1, torch.tensor([5, 6, 7]).to(META), k, v)
        with pytest.raises(DeviceMismatch):  # slots left on the host would fail on a GPU too
            kv.set_kv_buffer(1, torch.tensor([5, 6, 7]), k, v)
    assert dd.syncs == [], dd.report()


def test_logits_processor_on_the_device():
    proc = LogitsProcessor(SimpleNamespace(vocab_size=100))
    with torch.device(META):
        head = ParallelLMHead(128, 32)
    hidden = torch.zeros(9, 32, device=META)
    with DeviceDiscipline() as dd:
        for mode, lens in ((ForwardMode.EXTEND, [4, 5]), (ForwardMode.DECODE, None)):
            n = 9 if lens else 2
            fb = ForwardBatch(mode, 2, torch.zeros(n, dtype=torch.int64), torch.zeros(n, dtype=torch.int64),
                              torch.tensor([1, 2]), torch.tensor([4, 5]), torch.zeros(n, dtype=torch.int64),
                              extend_seq_lens_cpu=lens or [], extend_seq_lens=torch.tensor(lens) if lens else None)
            move_to_device(fb, META)
            assert proc(fb.input_ids, hidden[:n], head, fb).shape == (2, 100)
    assert dd.syncs == [], dd.report()


# ---------------------------------------------------------------------------------------------- whole steps
@pytest.fixture(scope="module")
def model_dir():
    from sglang.test.engine_fixtures import default_model_dir

    return default_model_dir()


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from sglang.srt.utils.hf_transformers_utils import get_tokenizer

    return get_tokenizer(model_dir)


REQUESTS = {  # rid -> sampling params (+ logprob options): every sampler path and a grammar
    "greedy": dict(temperature=0),
    "top-p": dict(temperature=0.8, top_p=0.9, top_k=2000),
    "penalised": dict(temperature=0.7, repetition_penalty=1.2, frequency_penalty=0.5, min_p=0.1,
                      return_logprob=True, top_logprobs_num=3),
    "seeded": dict(temperature=1.0, seed=7, min_new_tokens=2, logit_bias={"5": 3.0}),
    "grammar": dict(temperature=0.5, regex="[ab]+"),
}


@pytest.mark.parametrize("backend,page_size", [("flashinfer", 16), ("torch_native", 1)])
def test_scheduler_steps_on_the_stand_in_device(model_dir, tokenizer, backend, page_size):
    """Prefill and decode steps of the real Scheduler over pools, buffers and weights on the stand-in device, with
    every sampler path and a grammar in the batch: no device/host mix, no data-dependent op, and at most one
    device-to-host copy per step -- exactly one in each decode step (the sampled tokens and their logprobs)."""
    from sglang.test.attention_standins import install, make_flashinfer
    from sglang.test.meta_runner import meta_scheduler

    token_a = tokenizer.convert_tokens_to_ids("a")  # the device "answers" token "a": the grammar accepts it
    with install(make_flashinfer()):
        sched = meta_scheduler(model_dir, tokenizer=tokenizer, backend=backend, page_size=page_size)
        faults = []
        sched.on_fault = lambda message, cause: faults.append(f"{message}: {cause!r}")
        for i, (rid, opts) in enumerate(REQUESTS.items()):
            opts = dict(opts)
            lp, top = opts.pop("return_logprob", False), opts.pop("top_logprobs_num", 0)
            sp = SamplingParams(max_new_tokens=4, ignore_eos=True, **opts)
            sp.normalize()
            ids = list(range(300, 330 + 11 * i))
            sched.add_request(TokenizedGenerateReqInput(rid, None, ids, sp, return_logprob=lp, top_logprobs_num=top))
        per_step, tokens, finish = [], {rid: [] for rid in REQUESTS}, {}
        for _ in range(12):
            if not sched.reqs:
                break
            decoding = bool(sched.running) and not sched.waiting_queue and not len(sched.grammar_backend or [])
            with DeviceDiscipline(answer=lambda t: torch.tensor(token_a)) as dd:
                outputs = sched.step()
            per_step.append((decoding, [str(s) for s in dd.syncs]))
            for out in outputs:
                tokens[out.rid] += out.new_token_ids
                if out.finished:
                    finish[out.rid] = out.finish_reason["type"]
    assert faults == []
    assert not sched.reqs, "every request finished"
    # the host got what the device "sampled" for every request, the grammar's matcher accepted it at every step
    assert tokens == {rid: [token_a] * 4 for rid in REQUESTS} and set(finish.values()) == {"length"}
    assert all(len(syncs) <= 1 for _, syncs in per_step), per_step
    decode_steps = [syncs for decoding, syncs in per_step if decoding]
    assert len(decode_steps) >= 3 and all(len(s) == 1 and "sampler.py" in s[0] for s in decode_steps), per_step
    sched.check_integrity()

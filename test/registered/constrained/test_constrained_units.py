"""Constrained-decoding parts without a model: the compiled-grammar cache, the batch bitmask against a brute-force
matcher reference, logit_bias, the sampler with grammars, the memory-plan term, and the edge's checks."""

import threading

import pytest
import torch

from sglang.srt.constrained.grammar_cache import GrammarCache
from sglang.srt.constrained.logits_mask import _mask_rows_, apply_grammar_mask_, apply_logit_bias_
from sglang.srt.constrained.token_bitmask import TokenBitmask
from sglang.srt.constrained.request_grammar import GrammarRejectedToken, RequestGrammar
from sglang.srt.sampling.sampler import sample
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="cpu")

xgr = pytest.importorskip("xgrammar")

VOCAB = ["<eos>", "a", "b", "ab", "{", "}", '"', "1", "2", " ", "x", "yes", "no", "12", "ba"]
EOS = 0


@pytest.fixture(scope="module")
def compiler():
    info = xgr.TokenizerInfo(VOCAB, stop_token_ids=[EOS])
    return xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)


class FakeReq:
    def __init__(self, grammar=None, **sp):
        self.sampling_params = SamplingParams.from_dict(sp)
        self.output_ids, self.stop_token_ids, self.return_logprob = [], {EOS}, False
        self.top_logprobs_num, self.generator, self.grammar = 0, None, grammar
        self.fill_ids = [1]


def grammar_of(compiler, regex):
    released = []
    g = RequestGrammar("regex", xgr.GrammarMatcher(compiler.compile_regex(regex)), lambda: released.append(1))
    return g, released


def allowed_by_brute_force(compiler, regex, prefix):
    """Token t is allowed iff a fresh matcher fed `prefix` then accepts t."""
    out = set()
    for t in range(len(VOCAB)):
        m = xgr.GrammarMatcher(compiler.compile_regex(regex))
        assert all(m.accept_token(p) for p in prefix)
        if m.accept_token(t):
            out.add(t)
    return out


# ---------------------------------------------------------------------- cache
def test_cache_shares_compiles_drops_failures_and_evicts_lru():
    calls = []
    gate = threading.Event()

    class Compiled:
        memory_size_bytes = 100

    def compile_fn(kind, text):
        calls.append((kind, text))
        gate.wait(5)
        if text == "bad":
            raise RuntimeError("no")
        return Compiled()

    cache = GrammarCache(compile_fn, budget_bytes=250)
    f1, f2 = cache.get("regex", "a"), cache.get("regex", "a")
    assert f1 is f2 and cache.num_hits == 1  # one compile for both, in flight
    gate.set()
    f1.result(5)
    bad = cache.get("regex", "bad")
    with pytest.raises(RuntimeError):
        bad.result(5)
    assert cache.get("regex", "bad") is not bad  # a failure is not kept: the next request tries again
    for text in ("b", "c", "d"):
        cache.get("regex", text).result(5)
    # budget 250 B holds two 100 B grammars: the least recently used ("a", then "b") went first
    assert cache.cached_bytes <= 250
    assert cache.get("regex", "d").done() and cache.num_compiles == 6
    assert ("regex", "a") not in cache._entries and ("regex", "c") in cache._entries
    cache.shutdown()


# ---------------------------------------------------------------------- bitmask
def test_batch_mask_matches_brute_force_and_leaves_free_rows(compiler):
    torch.manual_seed(0)
    regexes = ["(ab|a)+b", "yes|no", "1[12]*"]
    prefixes = [[1], [], [7, 8]]
    reqs, grammars = [], []
    for rx, pre in zip(regexes, prefixes):
        g, _ = grammar_of(compiler, rx)
        for t in pre:
            g.accept(t)
        grammars.append(g)
        reqs.append(FakeReq(g))
    reqs.insert(1, FakeReq(None))  # an unconstrained row in the middle
    logits = torch.randn(len(reqs), len(VOCAB))
    before = logits.clone()
    bitmask = TokenBitmask(8, len(VOCAB))
    apply_grammar_mask_(logits, reqs, bitmask)
    assert torch.equal(logits[1], before[1])
    for row, (rx, pre) in zip((0, 2, 3), zip(regexes, prefixes)):
        allowed = allowed_by_brute_force(compiler, rx, pre)
        got = {t for t in range(len(VOCAB)) if logits[row, t] > float("-inf")}
        assert got == allowed, (rx, got, allowed)
        assert torch.equal(logits[row, sorted(allowed)], before[row, sorted(allowed)])


def test_rows_filled_during_the_forward_are_used_once_and_only_where_still_exact(compiler, monkeypatch):
    from sglang.srt.constrained.bitmask_fill import BitmaskFiller

    regexes, prefixes = ["(ab|a)+b", "yes|no", "1[12]*"], [[1], [], [7, 8]]
    words = xgr.get_bitmask_shape(1, len(VOCAB))[1]
    filler = BitmaskFiller(torch.zeros(8, words, dtype=torch.int32))
    reqs = []
    for rx, pre in zip(regexes, prefixes):
        g, _ = grammar_of(compiler, rx)
        g.filler = filler
        for t in pre:
            g.accept(t)
        reqs.append(FakeReq(g))
        reqs[-1].rx, reqs[-1].accepted = rx, list(pre)
    reqs.insert(1, FakeReq(None))
    synced = []
    real_fill = RequestGrammar.fill_bitmask
    monkeypatch.setattr(RequestGrammar, "fill_bitmask", lambda g, bm, row: (synced.append(row), real_fill(g, bm, row)))
    real_now = BitmaskFiller.fill  # several rows at sample time: the worker thread and the sampler share them
    monkeypatch.setattr(BitmaskFiller, "fill", lambda f, gs, rows: (synced.extend(rows), real_now(f, gs, rows)))

    def check(batch):
        logits = torch.randn(len(batch), len(VOCAB))
        apply_grammar_mask_(logits, batch, TokenBitmask.on_host(filler.bitmask))
        for row, req in enumerate(batch):
            if req.grammar is None:
                assert torch.isfinite(logits[row]).all()
                continue
            allowed = allowed_by_brute_force(compiler, req.rx, req.accepted)
            assert {t for t in range(len(VOCAB)) if logits[row, t] > float("-inf")} == allowed, (req.rx, row)

    filler.start(reqs)
    check(reqs)
    assert synced == [] and filler.num_jobs == 1  # every constrained row came from the worker thread
    filler.start(reqs)
    check(reqs[2:])  # a retry in halves: other rows for these requests -> filled again here
    check(reqs[:2])  # the job's rows were taken once (row 0 was just overwritten) -> filled again here too
    assert synced == [0, 1, 0]
    synced.clear()
    filler.start(reqs)
    check([reqs[2]])  # a retry of one request: its row moved -> filled here, over the job's row 0
    check(reqs[:2])  # so row 0 no longer holds what the job wrote for reqs[0]: filled again, not reused
    assert synced == [0, 0]
    synced.clear()
    filler.start(reqs)
    reqs[0].grammar.accept(3)  # the matcher moved on after the fill ("a" + "ab"): its row is stale
    reqs[0].accepted.append(3)
    check(reqs)
    assert synced == [0]
    filler.shutdown()


@pytest.mark.parametrize("vocab", [64, 1000, 49152])
def test_byte_table_mask_equals_xgrammars_kernel(vocab):
    """The sampler's own mask application (a byte table + one add) against xgrammar's apply_token_bitmask_inplace,
    on random bitmasks: every row, a subset of rows, a vocabulary that is not a multiple of 32."""
    import xgrammar as xgr

    gen = torch.Generator().manual_seed(vocab)
    words = (vocab + 31) // 32
    bitmask = torch.randint(-2**31, 2**31 - 1, (6, words), dtype=torch.int32, generator=gen)
    logits = torch.randn(5, vocab, generator=gen)
    for rows in ([0, 1, 2, 3, 4], [1, 3]):
        ours, ref = logits.clone(), logits.clone()
        _mask_rows_(ours, bitmask[:5], rows)
        xgr.apply_token_bitmask_inplace(ref, bitmask[:5], vocab_size=vocab, indices=rows)
        assert torch.equal(ours, ref)
        untouched = [i for i in range(5) if i not in rows]
        assert torch.isinf(ours[rows]).any() and torch.equal(ours[untouched], logits[untouched])


def test_dead_row_gets_a_uniform_choice_among_allowed(compiler):
    g, _ = grammar_of(compiler, "yes|no")
    logits = torch.full((1, len(VOCAB)), float("-inf"))
    apply_grammar_mask_(logits, [FakeReq(g)], TokenBitmask(1, len(VOCAB)))
    assert {t for t in range(len(VOCAB)) if logits[0, t] == 0.0} == {11, 12}


def test_logit_bias_adds_to_named_tokens():
    logits = torch.zeros(2, len(VOCAB))
    apply_logit_bias_(logits, [FakeReq(logit_bias={"3": 100.0, "5": -100}), FakeReq()])
    assert logits[0, 3] == 100 and logits[0, 5] == -100 and logits[0].abs().sum() == 200
    assert logits[1].abs().sum() == 0


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_sampler_output_is_always_accepted_and_grammar_terminates(compiler, temperature):
    torch.manual_seed(1)
    g, released = grammar_of(compiler, "(ab|a)+b")
    req = FakeReq(g, temperature=temperature)
    bitmask = TokenBitmask(4, len(VOCAB))
    text = ""
    for _ in range(40):
        tok = sample(torch.randn(1, len(VOCAB)), [req], bitmask).next_token_ids[0]
        if g.accept(tok):
            break
        text += VOCAB[tok]
        req.output_ids.append(tok)
    else:
        pytest.fail("grammar never terminated")
    import re
    assert re.fullmatch("(ab|a)+b", text), text
    g.release(), g.release()
    assert released == [1]  # release is idempotent


def test_rejected_token_raises(compiler):
    g, _ = grammar_of(compiler, "yes|no")
    with pytest.raises(GrammarRejectedToken):
        g.accept(1)


# ---------------------------------------------------------------------- plan + allocation
def test_plan_term_is_bitmask_rows_plus_cache_budget_and_backend_allocates_it():
    from sglang.srt.constrained.backend import GrammarBackend
    from sglang.srt.mem_plan import plan_memory
    from sglang.srt.mem_plan.inputs import PlanInputs
    from sglang.srt.mem_plan.sizes import grammar_bitmask_bytes_per_slot, grammar_cache_budget_bytes

    vocab = 49152
    per_slot = grammar_bitmask_bytes_per_slot(vocab)
    assert per_slot == -(-vocab // 32) * 4 == 6144
    base = dict(pre_load_free_bytes=8 << 30, weight_bytes=1 << 30, kv_cell_bytes=4096, context_len=4096,
                max_running_requests=64)
    plan = plan_memory(PlanInputs(**base, grammar_per_req_bytes=per_slot, grammar_cache_bytes=grammar_cache_budget_bytes(64)))
    off = plan_memory(PlanInputs(**base))
    assert plan.bytes_of("grammar") == 64 * 2**20 + per_slot * plan.max_running_requests
    assert off.bytes_of("grammar") == 0
    assert plan.max_total_num_tokens < off.max_total_num_tokens  # the term is charged against the KV pool
    backend = GrammarBackend(None, vocab, [0], plan.max_running_requests, grammar_cache_budget_bytes(64))
    assert backend.bitmask.device_bytes() == per_slot * plan.max_running_requests
    assert backend.planned_bytes() == plan.bytes_of("grammar")  # on a CPU the cache budget is planned memory too
    backend.shutdown()
    # on a GPU (the meta device stands in) the plan charges the device rows only: the cache and the host rows live
    # in host memory
    gpu = GrammarBackend(None, vocab, [0], 64, grammar_cache_budget_bytes(64), device="meta")
    assert gpu.bitmask.device.device.type == "meta" and gpu.bitmask.host.device.type == "cpu"
    assert gpu.planned_bytes() == per_slot * 64
    gpu.shutdown()


def test_build_inputs_declare_the_term_only_with_a_backend():
    from sglang.srt.mem_plan.build import DeviceFacts, grammar_terms
    from sglang.srt.server_args import ServerArgs

    class Facts:
        class shape:
            class text:
                vocab_size = 1000

    cpu, gpu = DeviceFacts("cpu", 8 << 30), DeviceFacts("cuda", 80 << 30)
    assert grammar_terms(ServerArgs(grammar_cache_mb=3), Facts, cpu) == (128, 3 * 2**20)
    assert grammar_terms(ServerArgs(grammar_cache_mb=3), Facts, gpu) == (128, 0)  # compiled grammars: host memory
    assert grammar_terms(ServerArgs(grammar_backend="none"), Facts, cpu) == (0, 0)


# ---------------------------------------------------------------------- edge checks
def test_edge_refuses_bad_grammars_and_a_disabled_backend():
    from sglang.srt.managers.request_error import RequestError
    from sglang.srt.managers.request_tokenizer import RequestTokenizer

    rt = RequestTokenizer(None, None, 100, 64, 64, 63)
    off = RequestTokenizer(None, None, 100, 64, 64, 63, grammar_backend="none")
    ok = rt.tokenize_request(input_ids=[1, 2], sampling_params={"regex": "[0-9]+", "max_new_tokens": 4})
    assert ok.sampling_params.grammar == ("regex", "[0-9]+")
    cases = [
        (rt, {"json_schema": '{"type": "objec"}'}, "json_schema", 'Unsupported type "objec"'),
        (rt, {"regex": "[a-"}, "regex", "Unclosed '['"),
        (rt, {"ebnf": "root ::= foo"}, "ebnf", 'Rule "foo" is not defined'),
        (rt, {"regex": "a", "ebnf": 'root ::= "a"'}, "ebnf", "Only one constraint"),
        (rt, {"logit_bias": {"100": 1}}, "logit_bias", "outside the vocabulary"),
        (rt, {"logit_bias": {"5": -101}}, "logit_bias", "[-100, 100]"),
        (off, {"regex": "a"}, "regex", "--grammar-backend none"),
    ]
    for tok, sp, param, words in cases:
        with pytest.raises(RequestError) as ei:
            tok.tokenize_request(input_ids=[1, 2], sampling_params=dict(sp, max_new_tokens=4))
        assert ei.value.status_code == 400 and ei.value.param == param and words in ei.value.message, ei.value.message


def test_default_grammar_backend_needs_xgrammar_installed(monkeypatch):
    """xgrammar is an extra (python/pyproject.toml): without it the default --grammar-backend is refused at startup
    with the install command, instead of failing the first structured request; --grammar-backend none still starts."""
    import importlib.util

    from sglang.srt.server_args import ServerArgs

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "xgrammar" else real(name, *a))
    with pytest.raises(ValueError, match=r"needs the xgrammar package.*scripts/install.sh.*--grammar-backend none"):
        ServerArgs()
    assert ServerArgs(grammar_backend="none").grammar_backend == "none"

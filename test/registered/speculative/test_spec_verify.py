"""speculative/verify.py without a model: synthetic target rows over a small vocabulary, the scheduler's real Req
(its append_token_id: grammar, stop tokens, max_new_tokens) and a commit that appends like the output sink.
References are independent of verify: argmax chains, the chain-rule probabilities of the rows, and non-speculative
decoding (sample() called token by token on a fresh request with the same seed / penalties / grammar)."""

import json

import pytest
import torch

from sglang.srt.constrained.request_grammar import RequestGrammar
from sglang.srt.constrained.token_bitmask import TokenBitmask
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.sampling.sampler import sample
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.speculative import verify as verify_mod
from sglang.srt.speculative.verify import verify
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=25, suite="cpu")

EOS = 0
V = 16


def make_req(rid="r", prompt=(1, 2), **sp) -> Req:
    sp.setdefault("max_new_tokens", 64)
    return Req(rid, list(prompt), SamplingParams(**sp), eos_token_ids={EOS})


def sink_commit(reqs, log):
    """The output sink's part of a commit: logprobs, append_token_id; False once the request finished."""
    def commit(i, out, row):
        req, tok = reqs[i], out.next_token_ids[row]
        if req.return_logprob:
            req.output_token_logprobs.append(out.token_logprobs[row])
            if out.top_logprobs is not None:
                req.output_top_logprobs.append(out.top_logprobs[row])
        req.append_token_id(tok)
        log.append((i, tok))
        return not req.finished()
    return commit


def run_verify(rows_per_req, reqs, proposals, bitmask=None):
    """rows_per_req: a [k_i + 1, V] tensor per request. Returns (counts, committed tokens per request, log)."""
    offsets, acc = [], 0
    for r in rows_per_req:
        offsets.append(acc)
        acc += r.shape[0]
    log = []
    counts = verify(torch.cat(rows_per_req).clone(), reqs, proposals, offsets, sink_commit(reqs, log), bitmask)
    return counts, [[t for j, t in log if j == i] for i in range(len(reqs))], log


def non_speculative(rows, req, proposals, bitmask=None):
    """Decode token by token from the rows, as if row j were the target's distribution after the proposals before
    it (only meaningful while the tokens equal the proposals: the rows after a mismatch are not the target's).
    proposals None: every row, as if each draw had been proposed."""
    out = []
    for j in range(rows.shape[0]):
        tok = sample(rows[j: j + 1].clone(), [req], bitmask).next_token_ids[0]
        req.append_token_id(tok)
        out.append(tok)
        if proposals is not None and (req.finished() or j == len(proposals) or tok != proposals[j]):
            break
    return out


# ---------------------------------------------------------------------------------------------------------- greedy
def argmax_chain(rows, proposals):
    out = []
    for j in range(rows.shape[0]):
        out.append(int(rows[j].argmax()))
        if j == len(proposals) or out[-1] != proposals[j]:
            break
    return out


def test_greedy_commits_the_argmax_chain_and_stops_at_the_first_mismatch():
    g = torch.Generator().manual_seed(0)
    rows = [torch.randn(k + 1, V, generator=g) for k in (3, 3, 0, 4)]
    best = [r.argmax(dim=1).tolist() for r in rows]
    proposals = [
        best[0][:3],                               # every proposal kept: the bonus row's token follows
        [best[1][0], (best[1][1] + 1) % V, 7],     # the second one rejected: its row's argmax is the correction
        [],                                        # no proposals: one ordinary token
        [(best[3][0] + 3) % V, 1, 2, 3],           # the first one rejected
    ]
    reqs = [make_req(f"r{i}", temperature=0.0) for i in range(4)]
    counts, got, log = run_verify(rows, reqs, proposals)
    want = [argmax_chain(r, p) for r, p in zip(rows, proposals)]
    assert got == want and counts == [len(w) for w in want] == [4, 2, 1, 1]
    assert [i for i, _ in log] == sorted(i for i, _ in log)  # request by request, in order
    assert [r.output_ids for r in reqs] == want


def test_a_finished_request_stops_the_chain():
    rows = torch.zeros(4, V)
    rows[:, 5] = 1.0
    rows[2, EOS] = 9.0
    req, capped = make_req("eos", temperature=0.0), make_req("cap", temperature=0.0, max_new_tokens=1)
    counts, got, _ = run_verify([rows, rows], [req, capped], [[5, 5, 5], [5, 5, 5]])
    assert got == [[5, 5, EOS], [5]] and counts == [3, 1]
    assert req.finished_reason["type"] == "stop" and capped.finished_reason["type"] == "length"


def test_logprobs_are_the_target_rows():
    g = torch.Generator().manual_seed(1)
    rows = [torch.randn(3, V, generator=g), torch.randn(3, V, generator=g)]
    reqs = [make_req("a", temperature=0.0), make_req("b", temperature=0.7, seed=3)]  # batched, sequential
    reqs[0].return_logprob = reqs[1].return_logprob = True
    reqs[0].top_logprobs_num = reqs[1].top_logprobs_num = 2
    proposals = [rows[0].argmax(dim=1).tolist()[:2], rows[1].argmax(dim=1).tolist()[:2]]
    counts, got, _ = run_verify(rows, reqs, proposals)
    for req, r, toks in zip(reqs, rows, got):
        lp = torch.log_softmax(r.double(), dim=1)
        assert req.output_token_logprobs == pytest.approx([float(lp[j, t]) for j, t in enumerate(toks)], abs=1e-5)
        for j, top in enumerate(req.output_top_logprobs):
            vals, ids = lp[j].topk(2)
            assert [t for t, _ in top] == ids.tolist() and [v for _, v in top] == pytest.approx(vals.tolist(), abs=1e-5)


# ---------------------------------------------------------------------------------------- distribution (unseeded)
def chi_square_p(counts, probs):
    from scipy.stats import chisquare

    n = sum(counts)
    return chisquare(counts, [p * n for p in probs]).pvalue


def outcome_law(p, d):
    """The chain rule over what one verify of proposals d = (d1, d2) commits from rows p[0..2]: a correction at row
    0 or 1, or both proposals and a bonus token."""
    law = {(a,): p[0][a] for a in range(len(p[0])) if a != d[0]}
    law.update({(d[0], b): p[0][d[0]] * p[1][b] for b in range(len(p[1])) if b != d[1]})
    law.update({(d[0], d[1], c): p[0][d[0]] * p[1][d[1]] * p[2][c] for c in range(len(p[2]))})
    return law


ROWS_4 = torch.tensor([[2.0, 1.5, 0.5, 0.0], [0.3, 1.8, 1.0, 0.0], [0.0, 0.7, 1.2, 0.4]])
PROPOSALS_4 = [0, 1]  # the likeliest token of each row: accepted ~49% / ~48% of the time


def committed_counts(n, mutate=None):
    torch.manual_seed(1234)
    reqs = [make_req(f"u{i}", temperature=1.0, ignore_eos=True) for i in range(n)]
    counts, got, _ = run_verify([ROWS_4] * n, reqs, [list(PROPOSALS_4)] * n)
    if mutate:
        got = [mutate(g) for g in got]
    law = outcome_law(torch.softmax(ROWS_4.double(), dim=1).tolist(), PROPOSALS_4)
    keys = sorted(law)
    hist = {k: 0 for k in keys}
    for g in got:
        hist[tuple(g)] += 1
    return [hist[k] for k in keys], [law[k] for k in keys]


def test_unseeded_sampling_keeps_the_target_distribution():
    observed, probs = committed_counts(4000)
    assert chi_square_p(observed, probs) > 1e-3, (observed, probs)


def test_the_chi_square_rejects_always_accepting():
    # the mutant: proposals kept with probability 1, then the bonus row's token
    observed, probs = committed_counts(4000, mutate=lambda g: PROPOSALS_4 + [g[-1]] if len(g) == 3 else
                                       PROPOSALS_4 + [int(torch.multinomial(torch.softmax(ROWS_4[2], 0), 1))])
    assert chi_square_p(observed, probs) < 1e-3


# --------------------------------------------------------------------------------------------------------- seeded
@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_a_seed_gives_the_tokens_of_non_speculative_decoding(top_p):
    g = torch.Generator().manual_seed(7)
    rows = torch.randn(5, V, generator=g)
    seeded = dict(temperature=1.0, top_p=top_p, seed=42, ignore_eos=True)
    full = non_speculative(rows, make_req("ref", **seeded), None)  # every proposal equal to the draw: 5 tokens
    for cut in range(5):  # proposals equal to the seeded draws up to `cut`, then one that differs
        props = full[:cut] + ([(full[cut] + 1) % V] if cut < 4 else [])
        req, plain = make_req("s", **seeded), make_req("u", temperature=1.0, ignore_eos=True)
        counts, got, _ = run_verify([rows, rows], [req, plain], [props, props])
        ref = make_req("ref", **seeded)
        want = non_speculative(rows, ref, props)
        assert got[0] == want == full[:cut + 1] and counts[0] == cut + 1
        # the generator advanced exactly once per committed token: the next draws agree too
        nxt = torch.randn(1, V, generator=g)
        assert sample(nxt.clone(), [req]).next_token_ids == sample(nxt.clone(), [ref]).next_token_ids


# ------------------------------------------------------------------------------------ penalties, min_new_tokens
def test_penalty_rows_see_the_proposals_before_them():
    rows = torch.zeros(4, V)
    rows[:, 3], rows[:, 4], rows[:, 5] = 5.0, 4.0, 3.5
    for sp in (dict(presence_penalty=2.0), dict(frequency_penalty=1.2), dict(repetition_penalty=2.0)):
        want = non_speculative(rows, make_req("ref", temperature=0.0, **sp), None)
        assert want != rows.argmax(dim=1).tolist()  # the penalties change the chain
        counts, got, _ = run_verify([rows], [make_req("p", temperature=0.0, **sp)], [want[:3]])
        assert got[0] == want and counts[0] == len(want), sp


def test_min_new_tokens_rows_see_the_proposals_before_them():
    rows = torch.zeros(4, V)
    rows[:, EOS] = 10.0
    for j in range(4):
        rows[j, 5 + j] = 5.0
    want = non_speculative(rows, make_req("ref", temperature=0.0, min_new_tokens=3), [5, 6, 7])
    assert want == [5, 6, 7, EOS]
    req = make_req("m", temperature=0.0, min_new_tokens=3)
    counts, got, _ = run_verify([rows], [req], [[5, 6, 7]])
    assert got[0] == want and counts == [4] and req.finished_reason["type"] == "stop"


# -------------------------------------------------------------------------------------------------------- grammar
xgr = pytest.importorskip("xgrammar")
VOCAB = ["<eos>", "{", "}", '"', "a", "b", ":", "1", "2", ",", " ", "x", '{"a":', "12", "[", "]"]
SCHEMA = json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
                     "additionalProperties": False})


@pytest.fixture(scope="module")
def compiled():
    info = xgr.TokenizerInfo(VOCAB, stop_token_ids=[EOS])
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    return compiler.compile_json_schema(SCHEMA, any_whitespace=False, separators=(",", ":"))


def grammar_req(compiled, rid, **sp):
    req = make_req(rid, **sp)
    req.grammar = RequestGrammar("json_schema", xgr.GrammarMatcher(compiled), lambda: None)
    return req


def allowed_after(compiled, prefix):
    out = set()
    for t in range(len(VOCAB)):
        m = xgr.GrammarMatcher(compiled)
        assert all(m.accept_token(p) for p in prefix)
        if m.accept_token(t):
            out.add(t)
    return out


@pytest.mark.parametrize("sp", [dict(temperature=0.0), dict(temperature=1.0, seed=5), dict(temperature=1.0)])
def test_grammar_rows_commit_only_allowed_tokens_and_stop_at_a_disallowed_proposal(compiled, sp):
    props = [1, 3, 4, 3, 11, 7, 2]  # { " a " then x (not allowed after '{"a"'), ...
    rows = torch.randn(len(props) + 1, V, generator=torch.Generator().manual_seed(3))
    for j, t in enumerate(props):
        rows[j, t] += 30.0  # each proposal is its row's favourite, the disallowed x too
    bitmask = TokenBitmask(4, V)
    bitmask.host.fill_(-1)  # a stale fill allowing everything must not be used
    plain = make_req("plain", temperature=0.0)
    reqs = [plain, grammar_req(compiled, "g", **sp)]
    counts, got, _ = run_verify([rows, rows], reqs, [props, props], bitmask)
    assert got[0] == props[:4] + [11] + props[5:] + [int(rows[-1].argmax())]  # no grammar: everything kept
    assert got[1][:4] == props[:4] and len(got[1]) == counts[1] == 5 and got[1][4] != 11
    for j, t in enumerate(got[1]):
        assert t in allowed_after(compiled, got[1][:j]), (j, t)
    assert reqs[1].grammar.num_accepted == 5  # the matcher advanced over the committed tokens only
    ref = grammar_req(compiled, "ref", **sp)
    assert got[1] == non_speculative(rows, ref, props, bitmask)


def test_a_grammar_request_finishes_where_its_grammar_completes(compiled):
    props = [12, 7, 2, EOS, 5]  # {"a": 1 } <eos> completes the object
    rows = torch.zeros(len(props) + 1, V)
    for j, t in enumerate(props):
        rows[j, t] = 10.0
    req = grammar_req(compiled, "g", temperature=0.0)
    counts, got, _ = run_verify([rows], [req], [props], TokenBitmask(1, V))
    assert got[0] == [12, 7, 2, EOS] and counts == [4] and req.finished()
    assert json.loads("".join(VOCAB[t] for t in got[0][:-1])) == {"a": 1}


def test_sequential_and_batched_requests_are_split_as_documented():
    assert not verify_mod.needs_sequential(make_req(temperature=1.0))
    assert not verify_mod.needs_sequential(make_req(temperature=0.0, seed=1))  # greedy: the seed draws nothing
    assert verify_mod.needs_sequential(make_req(temperature=1.0, seed=1))


def test_a_client_logit_processor_sees_the_request_with_the_tokens_committed_before_its_row(monkeypatch):
    from sglang.srt.sampling import custom_logit_processor as clp

    seen = []

    def force_next(logits, params):  # allows only (output length + 5) % V: it reads the request's state
        for row, p in enumerate(params):
            seen.append(p["__req__"])
            logits[row] = float("-inf")
            logits[row, (len(p["__req__"].output_ids) + 5) % V] = 0.0
        return logits

    monkeypatch.setattr(clp, "processor_of", lambda s: force_next)
    req = make_req("c", temperature=1.0)
    req.custom_logit_processor = "force"
    rows = torch.randn(4, V, generator=torch.Generator().manual_seed(2))
    counts, got, _ = run_verify([rows], [req], [[5, 6, 8]])
    assert got == [[5, 6, 7]] and counts == [3] and seen == [req] * 3

"""NEXTN speculative decoding through sglang.Engine on a random DeepSeek-V3 checkpoint with one MTP layer
(sglang.test.deepseek_mtp: 2 target layers, the first dense, then routed + shared experts, MLA, YaRN; the MTP layer
model.layers.2.* under the published names; the default model's tokenizer). One engine (float32, 16-token chunked
prefill, a 256-token pool) decodes with its SpecDecoder and with it swapped out (spec_off) and must give the same
tokens, text and finish reasons: 8 prompts with stop strings the continuations reach, a prefix hit, and more requests
than the pool holds (decode retracts). Proposals are made (a random head: near-zero acceptance), and each proposal
chain equals an independent reference: the published MTP equations (sglang.test.deepseek_mtp.MTPReference) over the
request's whole text, fed transformers' DeepseekV3 final-normed hidden states as the target's features (the first
proposal), then the reference head's own hidden state (the next ones). The draft pool is a one-layer MLA latent pool
whose bytes are the plan's draft_kv_cache term; under a memory budget a start's pool is `sglang plan`'s within 3%.
Trees: a second engine with --speculative-eagle-topk 2 gives the same tokens as without (stop strings, a prefix hit,
retraction), and each recorded beam equals sglang.test.eagle_reference.reference_beam over the MTP reference (which
fails when a re-parented beam keeps its own latent KV rows or hidden state); and on a checkpoint whose MTP layer copies
its target (copying_checkpoint) most proposals are accepted, some steps commit through branch 1, and the beams match
the reference scores within 1e-4 (which fails when the catch-up reads branch 0's features after such a commit)."""

import os

import pytest
import torch

from sglang import Engine
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.deepseek_mtp import MTPReference, save_v3_with_mtp
from sglang.test.engine_fixtures import PROMPTS, assert_idle_and_intact, shutdown
from sglang.test.retraction_checks import retraction_prompts, run_retraction
from sglang.test.spec_fixtures import spec_off, uncapped_verify_budget

register_cpu_ci(est_time=360, suite="cpu")

NEW_TOKENS = 24
NUM_LAYERS = 2
FLAGS = dict(dtype="float32", speculative_algorithm="NEXTN", chunked_prefill_size=16, max_total_tokens=256,
             log_level="warning", random_seed=0)
PREFIX = "Here is a longer shared instruction that several requests start with, so the cache matches it: "
SUFFIXES = ["first", "second question", "and a third one"]
NEAR_TIE = 1e-3  # logits closer than this may order differently in two float32 computations


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from transformers import AutoTokenizer

    from sglang.test.engine_fixtures import default_model_dir

    tok = AutoTokenizer.from_pretrained(default_model_dir())
    path = save_v3_with_mtp(str(tmp_path_factory.mktemp("nextn")), NUM_LAYERS, vocab=(len(tok) + 63) // 64 * 64,
                            tokenizer=tok)
    engine = Engine(model_path=path, **FLAGS)
    yield engine, path, tok
    shutdown(engine)


def greedy(**kw) -> dict:
    return dict({"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}, **kw)


def run(engine, prompts, params):
    outs = engine.generate(prompts, params)
    assert_idle_and_intact(engine)
    return outs


def assert_same(got, want):
    for a, b in zip(got, want):
        assert a["output_ids"] == b["output_ids"]
        assert a["text"] == b["text"]
        assert a["meta_info"]["finish_reason"] == b["meta_info"]["finish_reason"]


def stats(engine):
    return engine.scheduler.get_stats()


class ProposalLog:
    """Records what the engine's proposer proposed and for which text (observes; changes nothing)."""

    def __init__(self, engine):
        self.proposer = engine.scheduler.runner.spec.proposer
        self.calls = []
        self.inner = self.proposer.propose

    def __enter__(self):
        def propose(reqs, max_k):
            out = self.inner(reqs, max_k)
            self.calls += [(r.rid, list(r.fill_ids), r.kv_len, list(p)) for r, p in zip(reqs, out) if p]
            return out

        self.proposer.propose = propose
        return self

    def __exit__(self, *exc):
        del self.proposer.propose


def test_greedy_equal_with_chunking_stops_and_proposals_as_reference(served):
    engine, path, tok = served
    with spec_off(engine):
        plain = run(engine, PROMPTS, [greedy() for _ in PROMPTS])
    params = [greedy() for _ in PROMPTS]
    stops = {}
    for i in (1, 4):  # a stop string from the middle of what the request generates
        text = plain[i]["text"]
        stops[i] = text[len(text) // 3: len(text) // 3 + 3]
        params[i]["stop"] = [stops[i]]
    engine.flush_cache()  # the run without speculation cached the prompts' target KV but wrote no draft KV
    before = stats(engine)
    with ProposalLog(engine) as log:
        got = run(engine, PROMPTS, params)
    after = stats(engine)
    with spec_off(engine):
        want = run(engine, PROMPTS, params)
    assert_same(got, want)
    assert [got[i]["meta_info"]["finish_reason"].get("matched") for i in stops] == list(stops.values())
    assert after["spec_proposed_tokens"] > before["spec_proposed_tokens"]
    assert all(o["meta_info"]["spec_verify_ct"] > 0 for o in got)
    assert engine.get_server_info()["speculative"]["algorithm"] == "NEXTN"
    # a request that borrowed a cached prefix (two prompts open with "The") reads the draft KV of the prefix's last
    # position as its first writer computed it (with that request's next token): exact for the target, not the head
    uncached = {o["meta_info"]["id"] for o in got if o["meta_info"]["cached_tokens"] == 0}
    check_proposals(path, [c for c in log.calls if c[0] in uncached])


def check_proposals(path, calls):
    """Each recorded chain d1..dk of a request whose last token sits at p = kv_len: d1 = the reference head's argmax
    at position p - 1 (token at p, the target's feature at p - 1) over the whole text, d_{j+1} its argmax one position
    on with token d_j and its own hidden state as the feature."""
    from transformers import DeepseekV3ForCausalLM

    target = DeepseekV3ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ref = MTPReference(path)
    checked = ties = 0
    for _, fill, p, props in calls[:24]:
        ids = torch.tensor(fill[: p + 1])
        with torch.no_grad():
            feats = target.model(input_ids=ids[None]).last_hidden_state[0]  # final-normed rows 0..p
        tokens, rows = ids[1:], feats[:p]
        for d in props:
            logits, hidden = ref(tokens, rows)
            top2 = logits[-1].topk(2)
            if int(top2.indices[0]) != d:
                assert float(top2.values[0] - logits[-1][d]) < NEAR_TIE, (fill, p, props, d)
                ties += 1
                break
            checked += 1
            tokens, rows = torch.cat([tokens, torch.tensor([d])]), torch.cat([rows, hidden[-1:]])
    assert checked >= 40 and ties <= 2, (checked, ties)


def test_prefix_hit_and_retraction(served):
    engine, _, tok = served
    engine.flush_cache()
    run(engine, [PREFIX + "zero"], [greedy(max_new_tokens=2)])  # caches the shared prefix
    hit = run(engine, [PREFIX + s for s in SUFFIXES], [greedy() for _ in SUFFIXES])
    assert all(o["meta_info"]["cached_tokens"] > 0 for o in hit)
    retract = retraction_prompts(len(tok))
    before = stats(engine)
    spec_retract, retractions = run_retraction(engine, retract)
    assert retractions > 0 and stats(engine)["spec_proposed_tokens"] > before["spec_proposed_tokens"]
    with spec_off(engine):
        engine.flush_cache()
        want = run(engine, [PREFIX + s for s in SUFFIXES], [greedy() for _ in SUFFIXES])
        plain_retract, _ = run_retraction(engine, retract)
    assert_same(hit, want)
    assert spec_retract == plain_retract


def test_draft_pool_is_the_planned_latent_pool(served):
    engine, _, _ = served
    runner = engine.scheduler.model_runner
    draft, plan = runner.draft_runner, runner.memory_plan
    assert getattr(draft.token_to_kv_pool, "is_mla", False)
    # one MTP layer's latent rows, kv_lora_rank 64 + rope 16, float32, over the target's slots and the dummy page
    assert draft.kv_bytes() == plan.bytes_of("draft_kv_cache") == 1 * 80 * 4 * (plan.max_total_num_tokens + 1)
    assert plan.bytes_of("draft_cuda_graphs") == 0
    # the head's own tensors (the embedding and lm_head are the target's): draft_heads.nextn_weights + its rope table
    assert plan.bytes_of("draft_weights") == draft.weight_bytes


def test_plan_equals_a_real_start(served):
    """Under a memory budget the solver prices a token at the target's latent row + the head's (640 + 320 B): the
    start's pool is `sglang plan`'s within 3%, and its draft pool is the draft_kv_cache term."""
    from sglang.cli.plan import run as plan_run

    _, path, _ = served
    flags = dict(dtype="float32", speculative_algorithm="NEXTN", max_total_memory_gb=1, log_level="warning")
    status, result, _ = plan_run(["--model-path", path, "--dtype", "float32", "--speculative-algorithm", "NEXTN",
                                  "--max-total-memory-gb", "1", "--device", "cpu", "--json"])
    assert status == 0
    dry = result["plan"]
    dry_terms = {t["name"]: t["num_bytes"] for t in dry["terms"]}
    engine = Engine(model_path=path, **flags)
    try:
        runner = engine.scheduler.model_runner
        plan, draft = runner.memory_plan, runner.draft_runner
        tokens = plan.max_total_num_tokens
        assert draft.kv_bytes() == plan.bytes_of("draft_kv_cache") == 320 * (tokens + runner.server_args.page_size)
        assert abs(tokens / dry["max_total_num_tokens"] - 1) < 0.03, (tokens, dry["max_total_num_tokens"])
        assert dry_terms["draft_weights"] == plan.bytes_of("draft_weights")
    finally:
        shutdown(engine)


# ------------------------------------------------------------------------------------------ trees (top-k 2, NEXTN)
@pytest.fixture(scope="module")
def tree_served(served):
    """A second engine on the same checkpoint with --speculative-eagle-topk 2 (every step proposing)."""
    from test_spec_eagle_engine import always_propose

    _, path, tok = served
    engine = Engine(model_path=path, speculative_eagle_topk=2, speculative_num_steps=3, **FLAGS)
    always_propose(engine)
    yield engine, path, tok
    shutdown(engine)


def test_tree_greedy_equal_and_beams_as_reference(tree_served):
    """Top-k 2: greedy tokens, texts and finish reasons == without speculation (8 prompts, stop strings, 16-token
    chunks, a prefix hit, retraction), nothing leaked; each recorded beam == the reference beam over MTPReference
    (sglang.test.eagle_reference.reference_beam), paths in order and cumulative log-probs within 1e-4."""
    from transformers import DeepseekV3ForCausalLM

    from sglang.test.eagle_reference import reference_beam
    from test_spec_eagle_tree import NEAR_TIE, record_trees

    engine, path, tok = tree_served
    with spec_off(engine):
        plain = run(engine, PROMPTS, [greedy() for _ in PROMPTS])
    params = [greedy() for _ in PROMPTS]
    for i in (1, 4):
        text = plain[i]["text"]
        params[i]["stop"] = [text[len(text) // 3: len(text) // 3 + 3]]
    engine.flush_cache()
    log = []
    before = stats(engine)
    with record_trees(engine, log):
        got = run(engine, PROMPTS, params)
        hit = run(engine, PROMPTS[:2], params[:2])  # cached prompts
    assert stats(engine)["spec_proposed_tokens"] > before["spec_proposed_tokens"]
    retract = retraction_prompts(len(tok))
    spec_retract, retractions = run_retraction(engine, retract)
    assert retractions > 0
    with spec_off(engine):
        want = run(engine, PROMPTS, params)
        plain_retract, _ = run_retraction(engine, retract)
    assert_same(got, want)
    assert_same(hit, want[:2])
    assert spec_retract == plain_retract
    uncached = {o["meta_info"]["id"] for o in got if o["meta_info"]["cached_tokens"] == 0}
    checked, ties = check_beams(path, [c for c in log[:40] if c[0] in uncached])
    assert checked >= 10 and ties <= 2, (checked, ties)


def check_beams(path, log):
    """(beams checked, near ties skipped): each recorded beam == reference_beam over MTPReference and transformers'
    final-normed target states, paths in order and cumulative log-probs within NEAR_TIE."""
    from transformers import DeepseekV3ForCausalLM

    from sglang.test.eagle_reference import reference_beam
    from test_spec_eagle_tree import NEAR_TIE

    target = DeepseekV3ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ref = MTPReference(path)
    checked = ties = 0
    for rid, fill, p, width, depth, paths, scores in log:
        if width < 2:
            continue
        ids = torch.tensor(fill[: p + 1])
        with torch.no_grad():
            feats = target.model(input_ids=ids[None]).last_hidden_state[0]
        want_paths, want_scores, gap = reference_beam(lambda t, h: ref(torch.tensor(t), h), fill[1: p + 1],
                                                      feats[:p], width, depth, lambda x: x)
        if gap < NEAR_TIE:
            ties += 1
            continue
        assert paths == want_paths, (fill, p)
        assert max(abs(a - b) for a, b in zip(scores, want_scores)) < NEAR_TIE, (scores, want_scores)
        checked += 1
    return checked, ties


def copying_checkpoint(path: str, tok) -> str:
    """save_v3_with_mtp with every attention output and MLP / expert down projection zero and every norm weight one:
    the target's next token is a function of its last token, its final-normed state at q one of the token at q; the
    MTP layer's eh_proj passes the embedding plus 0.01 x a random map of the feature, so the head proposes what the
    target decodes, up to the feature's small push on the scores."""
    from safetensors.torch import load_file, save_file

    save_v3_with_mtp(path, NUM_LAYERS, vocab=(len(tok) + 63) // 64 * 64, tokenizer=tok)
    file = os.path.join(path, "model.safetensors")
    w = load_file(file)
    for k in w:
        if "o_proj" in k or "down_proj" in k:
            w[k] = torch.zeros_like(w[k])
        elif k.endswith("norm.weight"):
            w[k] = torch.ones_like(w[k])
    H = w["model.embed_tokens.weight"].shape[1]
    g = torch.Generator().manual_seed(5)
    eh = f"model.layers.{NUM_LAYERS}.eh_proj.weight"
    w[eh] = torch.cat([torch.eye(H), 0.01 * torch.randn(H, H, generator=g) / H ** 0.5], 1)
    save_file(w, file, metadata={"format": "pt"})
    return path


def test_tree_side_branch_commits_with_a_copying_head(tmp_path):
    """Top-k 2 with a head that copies the target: most proposals accepted, some steps commit through branch 1, greedy
    == without; the beams after those commits == the reference (the catch-up read the home branch's features: from
    branch 0's rows the scores move by ~1e-2)."""
    from transformers import AutoTokenizer

    from sglang.test.engine_fixtures import default_model_dir
    from test_spec_eagle_engine import always_propose, unique_prompts
    from test_spec_eagle_tree import record_trees

    tok = AutoTokenizer.from_pretrained(default_model_dir())
    path = copying_checkpoint(str(tmp_path / "copy"), tok)
    with uncapped_verify_budget():  # every request's whole tree each step (always_propose), rows planned for it
        engine = Engine(model_path=path, speculative_eagle_topk=2, speculative_num_steps=3, **FLAGS)
    try:
        always_propose(engine)
        spec = engine.scheduler.runner.spec
        prompts = unique_prompts((len(tok) + 63) // 64 * 64, 4, seed=3)
        params = dict(greedy(), max_new_tokens=16)
        log = []
        with record_trees(engine, log):
            got = engine.generate(input_ids=prompts, sampling_params=params)
        assert_idle_and_intact(engine)
        with spec_off(engine):
            want = engine.generate(input_ids=prompts, sampling_params=params)
        assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]
        counters = spec.counters.to_dict()
        assert counters["accepted_tokens"] > counters["proposed_tokens"] // 4, counters
        assert spec.tree.side_branch_commits > 0
    finally:
        shutdown(engine)
    checked, ties = check_beams(path, log)
    assert checked >= 8 and ties <= 2, (checked, ties)

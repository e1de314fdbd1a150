"""The --speculative-* flags (upstream's names): their help, choices, the defaults each algorithm resolves to, and
the value checks. ServerArgs declares the fields; this module holds what they mean, so server_args.py stays the one
source of defaults while the speculative details live beside the code that runs them.

Counting convention (upstream's): with --speculative-eagle-topk 1 a request's verify forward holds
--speculative-num-draft-tokens tokens = its last accepted token + num-draft-tokens - 1 proposals, and a draft model or
head makes --speculative-num-steps forwards to propose them (so num-draft-tokens == num-steps + 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

SPECULATIVE_ALGORITHMS = ["NGRAM", "STANDALONE", "EAGLE", "EAGLE3", "NEXTN"]
# algorithms whose proposals come from a model loaded beside the target (NEXTN: the target checkpoint's own MTP layers)
DRAFT_MODEL_ALGORITHMS = ("STANDALONE", "EAGLE", "EAGLE3")

HELP = {
    "algorithm": "Speculative decoding: propose several tokens cheaply, verify them in one forward of the model. "
    "NGRAM: proposals copied from the prompt and the text so far (no extra model; runs on CPUs too); STANDALONE: a "
    "smaller draft model with the same tokenizer (--speculative-draft-model-path); EAGLE / EAGLE3: a draft head over "
    "the model's hidden states; NEXTN: a DeepSeek-style checkpoint's own MTP layers. Greedy output is identical to "
    "decoding without it, and sampling keeps the model's distribution exactly. Every byte it needs (draft weights and "
    "KV, verify rows) is a term of the memory plan. Unset: off.",
    "draft_model_path": "The draft model (STANDALONE) or draft head (EAGLE, EAGLE3) checkpoint directory. NEXTN: "
    "unset uses --model-path's own MTP layers.",
    "num_steps": "Forwards of the draft model or head per verify step (proposals per request). Default: 3 for "
    "STANDALONE / EAGLE / EAGLE3 / NEXTN; unused by NGRAM.",
    "eagle_topk": "Candidates kept per draft step (a tree of that many branches when > 1: STANDALONE, EAGLE, EAGLE3, "
    "NEXTN; --page-size 1). Default 1.",
    "num_draft_tokens": "Tokens verified per request and step: its last token plus the proposals (a tree: its "
    "nodes). Default: num-steps + 1 with top-k 1; top-k x num-steps + 1 with top-k > 1; 8 for NGRAM.",
    "ngram_min_match_window_size": "NGRAM: the shortest suffix of the text that is looked up for a continuation.",
    "ngram_max_match_window_size": "NGRAM: the longest suffix of the text that is looked up (longer matches are "
    "tried first).",
}

DEFAULT_NUM_STEPS = 3
DEFAULT_NGRAM_DRAFT_TOKENS = 8


@dataclass(frozen=True)
class SpecConfig:
    """The resolved speculative settings of a server (None when --speculative-algorithm is unset)."""

    algorithm: str
    num_steps: int
    topk: int
    num_draft_tokens: int  # tokens per request in one verify forward (proposals + 1)
    draft_model_path: Optional[str]
    ngram_min_window: int
    ngram_max_window: int

    @property
    def max_proposals(self) -> int:
        return self.num_draft_tokens - 1

    def to_dict(self) -> dict:
        return {"algorithm": self.algorithm, "num_steps": self.num_steps, "eagle_topk": self.topk,
                "num_draft_tokens": self.num_draft_tokens, "draft_model_path": self.draft_model_path}


def resolve_spec_config(a) -> Optional[SpecConfig]:
    """The settings `a` (a ServerArgs) asks for, defaults filled in; ValueError naming the flag when they cannot
    work together."""
    algo = a.speculative_algorithm
    given = [n for n in ("speculative_draft_model_path", "speculative_num_steps", "speculative_eagle_topk",
                         "speculative_num_draft_tokens") if getattr(a, n) is not None]
    if algo is None:
        if given:
            raise ValueError(f"--{given[0].replace('_', '-')} needs --speculative-algorithm (one of "
                             f"{', '.join(SPECULATIVE_ALGORITHMS)}); it does nothing without it.")
        return None
    topk = 1 if a.speculative_eagle_topk is None else a.speculative_eagle_topk
    for name, v in (("num-steps", a.speculative_num_steps), ("eagle-topk", topk),
                    ("num-draft-tokens", a.speculative_num_draft_tokens)):
        if v is not None and v < 1:
            raise ValueError(f"--speculative-{name} must be >= 1, got {v}.")
    if algo == "NGRAM":
        if a.speculative_draft_model_path is not None:
            raise ValueError("--speculative-draft-model-path with --speculative-algorithm NGRAM: NGRAM proposes from "
                             "the text itself and loads no draft model; drop the path or pick STANDALONE.")
        if a.speculative_num_steps is not None or topk != 1:
            raise ValueError("--speculative-num-steps / --speculative-eagle-topk apply to draft models and heads; "
                             "NGRAM takes --speculative-num-draft-tokens (tokens verified per step) only.")
        n_draft = a.speculative_num_draft_tokens or DEFAULT_NGRAM_DRAFT_TOKENS
        if n_draft < 2:
            raise ValueError(f"--speculative-num-draft-tokens {n_draft}: NGRAM needs at least 2 (the last token "
                             "and one proposal).")
        lo, hi = a.speculative_ngram_min_match_window_size, a.speculative_ngram_max_match_window_size
        if not (1 <= lo <= hi):
            raise ValueError(f"--speculative-ngram-min-match-window-size {lo} / --speculative-ngram-max-match-"
                             f"window-size {hi}: need 1 <= min <= max.")
        return SpecConfig(algo, n_draft - 1, 1, n_draft, None, lo, hi)
    if algo in DRAFT_MODEL_ALGORITHMS and a.speculative_draft_model_path is None:
        raise ValueError(f"--speculative-algorithm {algo} needs --speculative-draft-model-path (the draft "
                         f"{'model' if algo == 'STANDALONE' else 'head'} checkpoint).")
    steps = a.speculative_num_steps or DEFAULT_NUM_STEPS
    if topk > 1:
        return _tree_config(a, algo, steps, topk)
    n_draft = a.speculative_num_draft_tokens or steps + 1
    if n_draft != steps + 1:
        raise ValueError(f"--speculative-num-draft-tokens {n_draft} with --speculative-num-steps {steps} and "
                         f"--speculative-eagle-topk 1: a chain verifies num-steps + 1 = {steps + 1} tokens; pass "
                         f"--speculative-num-draft-tokens {steps + 1} or leave it unset.")
    return SpecConfig(algo, steps, topk, n_draft, a.speculative_draft_model_path,
                      a.speculative_ngram_min_match_window_size, a.speculative_ngram_max_match_window_size)


def _tree_config(a, algo: str, steps: int, topk: int) -> SpecConfig:
    """Top-k > 1: a tree of up to topk branches of num-steps proposals (managers/spec_tree.py); num-draft-tokens
    counts, as upstream, the verified nodes + 1 (default: a full beam's topk x num-steps nodes + 1)."""
    flag = f"--speculative-eagle-topk {topk}"
    if algo not in TREE_ALGORITHMS:
        raise ValueError(f"{flag} with --speculative-algorithm {algo}: tree proposals (top-k > 1) are served for "
                         f"{', '.join(TREE_ALGORITHMS)} only; use --speculative-eagle-topk 1 (a chain).")
    if a.page_size > 1:
        raise ValueError(f"{flag} with --page-size {a.page_size}: a tree's branches cannot share a request's partly "
                         "filled last page; use --page-size 1 or --speculative-eagle-topk 1.")
    most = topk * steps + 1
    n_draft = a.speculative_num_draft_tokens or most
    if not 2 <= n_draft <= most:
        raise ValueError(f"--speculative-num-draft-tokens {n_draft} with {flag} and --speculative-num-steps {steps}: "
                         f"a tree verifies 1 + at most topk x num-steps = {most} tokens and at least 2; pass a "
                         f"value in [2, {most}] or leave it unset.")
    return SpecConfig(algo, steps, topk, n_draft, a.speculative_draft_model_path,
                      a.speculative_ngram_min_match_window_size, a.speculative_ngram_max_match_window_size)


# algorithms whose proposer makes trees (top-k > 1)
TREE_ALGORITHMS = ("STANDALONE", "EAGLE", "EAGLE3", "NEXTN")

# what a server runs today; `sglang plan` prices every algorithm above
SERVED_ALGORITHMS: tuple = ("NGRAM", "STANDALONE", "EAGLE", "EAGLE3", "NEXTN")


def check_served(cfg: Optional[SpecConfig]) -> None:
    """Refuse, naming it, an algorithm this runtime plans but does not run yet."""
    if cfg is not None and cfg.algorithm not in SERVED_ALGORITHMS:
        served = ", ".join(SERVED_ALGORITHMS) or "none yet"
        raise ValueError(f"--speculative-algorithm {cfg.algorithm} is planned by `sglang plan` but not served by "
                         f"this runtime (served: {served}); drop the flag to serve without speculative decoding.")

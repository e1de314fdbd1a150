"""NGRAM proposals (speculative/ngram_proposer.py): the incremental index proposes what a brute-force search over the
token list finds -- the tokens after the most recent earlier occurrence of the longest matching suffix (lengths
min_window..max_window), up to max_k -- for random sequences over small vocabularies, at every length, fed one token
at a time and in chunks; and the proposer follows a request's prompt and output as they grow."""

import random
from types import SimpleNamespace

from sglang.srt.speculative.ngram_proposer import NgramIndex, NgramProposer
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="cpu")


def brute_force(tokens, lo, hi, max_k):
    """The reference: scan every earlier end position, longest suffix first, most recent occurrence first."""
    L = len(tokens)
    if max_k <= 0:
        return []
    for n in range(min(hi, L - 1), lo - 1, -1):
        suffix = tokens[L - n:]
        for e in range(L - 1, n - 1, -1):
            if tokens[e - n:e] == suffix:
                return tokens[e:min(e + max_k, L)]
    return []


def test_index_equals_brute_force_at_every_length():
    rng = random.Random(0)
    checked = nonempty = 0
    for trial in range(120):
        vocab = rng.choice([2, 3, 5, 12])
        lo = rng.randint(1, 3)
        hi = rng.randint(lo, 6)
        seq = [rng.randrange(vocab) for _ in range(rng.randint(1, 70))]
        idx = NgramIndex(lo, hi)
        pos = 0
        while pos < len(seq):
            step = 1 if trial % 2 else rng.randint(1, 9)  # one token at a time, or chunks (a prompt, then outputs)
            idx.extend(seq[pos:pos + step])
            pos = min(pos + step, len(seq))
            for k in (0, 1, 3, 7):
                got, want = idx.propose(k), brute_force(seq[:pos], lo, hi, k)
                assert got == want, (seq[:pos], lo, hi, k, got, want)
                checked += 1
                nonempty += bool(want)
    assert checked > 2000 and nonempty > checked // 3  # the cases exercise real matches, not only empty answers


def test_proposer_follows_prompt_and_output():
    p = NgramProposer(1, 4)
    req = SimpleNamespace(rid="r", origin_input_ids=[5, 6, 7, 8, 5, 6], output_ids=[])
    assert p.propose([req], [3]) == [[7, 8, 5]]  # "5 6" occurred before, followed by 7 8 5
    req.output_ids += [7, 9]  # "... 5 6 7 9": "7 9" never occurred; "9" neither
    assert p.propose([req], [3]) == [[]]
    req.output_ids += [5, 6, 7]  # suffix "5 6 7": its most recent earlier occurrence was followed by 9
    assert p.propose([req], [3]) == [[9, 5, 6]]
    assert p.propose([req], [0]) == [[]]
    p.release(req)
    assert p.tracked() == []

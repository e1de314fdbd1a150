"""IncrementalDetokenizer against the definition: at every token, the same piece as decoding the two windows with
the tokenizer's own `decode` (the algorithm written plainly below), and in all the text of decoding the whole
output at once; with one decode call per token, and the Rust fast path giving what `tokenizer.decode` gives."""

import random

import pytest

from sglang.srt.managers.incremental_detokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer, _rust_decode
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="cpu")

TEXTS = [
    "The river runs past the old mill, where the children used to play.",
    "Ünïcödé: naïve café, 東京タワー, emoji 🚀🔥👩‍👩‍👧 and math ∑∫√ — done.",
    "def f(x):\n    return x ** 2  # square\n\n\tprint(f(3))",
]


@pytest.fixture(scope="module")
def tokenizer():
    from sglang.srt.utils.hf_transformers_utils import get_tokenizer
    from sglang.test.engine_fixtures import default_model_dir

    return get_tokenizer(default_model_dir())


class CountingTokenizer:
    """Only `decode`, forwarded to the real tokenizer and counted (so the detokenizer takes its generic path)."""

    def __init__(self, tok):
        self.tok, self.calls = tok, 0

    def decode(self, ids, **kw):
        self.calls += 1
        return self.tok.decode(ids, **kw)


def reference_pieces(tok, ids, skip):
    """Two windows decoded with tokenizer.decode at every token; a piece ending in U+FFFD waits."""
    dec = lambda x: tok.decode(x, skip_special_tokens=skip)  # noqa: E731
    prefix = read = 0
    pieces = []
    for n in range(1, len(ids) + 1):
        prefix_text, full = dec(ids[prefix:read]), dec(ids[prefix:n])
        if full.endswith(REPLACEMENT_CHAR) or len(full) < len(prefix_text):
            pieces.append("")
            continue
        pieces.append(full[len(prefix_text):])
        prefix, read = read, n
    rest = dec(ids[prefix:])[len(dec(ids[prefix:read])):] if read < len(ids) else ""
    return pieces, rest


def sequences(tok):
    out = [tok.encode(t, add_special_tokens=False) for t in TEXTS]
    rng = random.Random(0)
    # random ids: byte tokens cut characters anywhere; special tokens (skipped or not) in the middle
    out.append([rng.randrange(tok.vocab_size) for _ in range(200)])
    specials = list(tok.all_special_ids)
    out.append(out[1][:9] + specials + out[1][9:])
    return out


@pytest.mark.parametrize("skip", [True, False])
def test_pieces_match_the_definition(tokenizer, skip):
    for ids in sequences(tokenizer):
        for tok in (tokenizer, CountingTokenizer(tokenizer)):  # the Rust path and the generic one
            d = IncrementalDetokenizer(tok, skip_special_tokens=skip)
            got = [d.add([t]) for t in ids]
            rest = d.flush()
            want, want_rest = reference_pieces(tokenizer, ids, skip)
            assert got == want
            assert rest == want_rest
            if REPLACEMENT_CHAR not in "".join(want) + want_rest:
                assert "".join(got) + rest == tokenizer.decode(ids, skip_special_tokens=skip)


def test_one_decode_per_token(tokenizer):
    ids = tokenizer.encode(TEXTS[0] * 3, add_special_tokens=False)
    counting = CountingTokenizer(tokenizer)
    IncrementalDetokenizer(counting).add(ids[:1])  # fills nothing much; the table is shared per tokenizer
    for _ in range(2):  # the second request finds every single-token text in the shared table
        counting.calls = 0
        d = IncrementalDetokenizer(counting)
        for t in ids:
            d.add([t])
    assert counting.calls == len(ids)


def test_rust_path_is_taken_and_agrees(tokenizer):
    for skip in (True, False):
        fast = _rust_decode(tokenizer, skip)
        assert fast is not None, "the default model's fast tokenizer should be decoded through Rust directly"
        rng = random.Random(1)
        for _ in range(200):
            ids = [rng.randrange(tokenizer.vocab_size) for _ in range(rng.randrange(1, 6))]
            assert fast(ids) == tokenizer.decode(ids, skip_special_tokens=skip)


def test_rust_path_refused_when_decode_differs(tokenizer):
    """A subclass that decodes its own way, or clean-up of tokenization spaces, keeps tokenizer.decode."""
    cls = type(tokenizer)
    own = type("OwnDecode", (cls,), {"_decode": lambda self, token_ids, **kw: "x"})
    obj = own.__new__(own)
    obj.__dict__.update(tokenizer.__dict__)
    assert _rust_decode(obj, True) is None
    assert IncrementalDetokenizer(obj).add([100]) == "x"
    obj2 = cls.__new__(cls)
    obj2.__dict__.update(tokenizer.__dict__)
    obj2.clean_up_tokenization_spaces = True
    assert _rust_decode(obj2, True) is None

"""Grammars that can begin but never finish, without a model: the productive-symbol analysis of xgrammar's grammar
(grammar_productivity.py) against xgrammar's own matcher as the reference -- each grammar called non-empty has a
witness string the matcher accepts to its end; each called empty has a byte tree the test searches exhaustively
with the matcher and finds no end in -- and the sampler's dead-end rows (a mask that allows nothing)."""

import json

import pytest
import torch

from sglang.srt.constrained.empty_language import NEVER_FINISHES_REASON, EmptyGrammarError
from sglang.srt.constrained.grammar_check import parse_grammar
from sglang.srt.constrained.grammar_productivity import class_is_empty, root_is_productive
from sglang.srt.constrained.logits_mask import apply_grammar_mask_
from sglang.srt.constrained.request_grammar import RequestGrammar
from sglang.srt.constrained.token_bitmask import TokenBitmask
from sglang.srt.sampling.sampler import sample
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.test.ci.ci_register import register_cpu_ci

from byte_reference import STOP, allowed_bytes, compile_kind, end_reachable
from byte_reference import byte_compiler as make_byte_compiler

register_cpu_ci(est_time=8, suite="cpu")

xgr = pytest.importorskip("xgrammar")


@pytest.fixture(scope="module")
def byte_compiler():
    return make_byte_compiler()


REQUIRED_CYCLE = {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}, "required": ["x"],
                  "$defs": {"a": {"$ref": "#/$defs/a"}}}
# (kind, grammar, whether its byte tree is finite: then the reference search is exhaustive, a proof; else bounded)
NEVER_FINISH = [
    ("ebnf", 'root ::= "a" rest\nrest ::= rest', True),
    ("ebnf", 'root ::= "a" root', False),
    ("ebnf", 'root ::= "x" (item | "y" item)\nitem ::= "[" item "]"', False),
    ("regex", r"a[^\s\S]", True),
    ("regex", r"(ab|cd)[^\s\S]", True),
    ("json_schema", json.dumps(REQUIRED_CYCLE), True),
    ("json_schema", json.dumps({"type": "array", "items": REQUIRED_CYCLE, "minItems": 1, "$defs": REQUIRED_CYCLE["$defs"]}),
     True),
    ("json_schema", json.dumps({**REQUIRED_CYCLE, "properties": {"e": {"type": "string", "pattern": "^q$"},
                                                                 **REQUIRED_CYCLE["properties"]},
                                "required": ["e", "x"]}), True),  # printed with a Regex(...) element
]
# (kind, grammar, a string it matches): the witness the reference matcher must accept to its end
MATCHING = [
    ("ebnf", 'root ::= "(" root ")" | "x"', "((x))"),
    ("ebnf", 'root ::= expr\nexpr ::= term ("+" term)*\nterm ::= [0-9]+ | "(" expr ")"', "(1+2)+34"),
    ("ebnf", 'root ::= "a" rest\nrest ::= rest | ""', "a"),
    ("ebnf", 'root ::= "a"? [b-c]{2,3} [^\\x00-\\x60]', "abcz"),
    ("ebnf", 'root ::= "\\"" [^"\\\\]* "\\""', '"q"'),
    ("regex", r"(foo|bar)+[a-z]{2,3}", "foobarxy"),
    ("regex", r"[^a]\-[\]x]", "b-]"),
    ("regex", r"\d{3}-[\u00e9\U0001F600]", "123-\U0001F600"),
    ("json_schema", json.dumps({"type": "object", "properties": {"a": {"type": "object", "properties": {
        "b": {"type": "array", "items": {"type": "string"}}}, "required": ["b"]}}, "required": ["a"]}),
     '{"a": {"b": ["x"]}}'),
    ("json_schema", json.dumps({"type": "object", "properties": {"n": {"$ref": "#/$defs/node"}}, "$defs": {"node": {
        "type": "object", "properties": {"next": {"$ref": "#/$defs/node"}, "v": {"type": "integer"}},
        "required": ["v"]}}}), '{"n": {"next": {"v": 1}, "v": 2}}'),
    ("json_schema", json.dumps({**REQUIRED_CYCLE, "required": []}), "{}"),  # the cycle is optional: {} matches
    ("json_schema", json.dumps({"anyOf": [REQUIRED_CYCLE, {"type": "integer"}], "$defs": REQUIRED_CYCLE["$defs"]}),
     "7"),
    ("json_schema", json.dumps({"type": "object", "properties": {"e": {"type": "string", "pattern": "^[a-z]{1,8}@x$"}},
                                "required": ["e"]}), '{"e": "ab@x"}'),  # printed with a Regex(...) element
]


@pytest.mark.parametrize("kind, text, finite", NEVER_FINISH)
def test_a_grammar_that_begins_but_never_finishes_is_found_empty(byte_compiler, kind, text, finite):
    compiled = compile_kind(byte_compiler, kind, text)
    assert allowed_bytes(xgr.GrammarMatcher(compiled)), "an output can begin: the start-state test cannot see it"
    # the reference: the whole byte tree holds no end; an infinite one: none in its first 300 prefixes
    assert end_reachable(compiled, max_nodes=300) is (False if finite else None)
    assert root_is_productive(str(compiled.grammar)) is False
    with pytest.raises(EmptyGrammarError) as ei:
        parse_grammar(kind, text)
    assert str(ei.value) == NEVER_FINISHES_REASON and "matches no string" in str(ei.value)


@pytest.mark.parametrize("kind, text, witness", MATCHING)
def test_a_grammar_some_string_matches_is_kept(byte_compiler, kind, text, witness):
    compiled = compile_kind(byte_compiler, kind, text)
    m = xgr.GrammarMatcher(compiled)
    assert m.accept_string(witness) and m.accept_token(STOP) and m.is_terminated(), witness  # the reference
    assert root_is_productive(str(compiled.grammar)) is True
    parse_grammar(kind, text)  # the edge keeps it


@pytest.mark.parametrize("printed", [
    "root ::= ((TagDispatch(\n  (\"<a>\", r),\n  loop_after_dispatch=true\n)))\nr ::= ((r))",
    "root ::= ((missing))",
    "start ::= ((start))",
])
def test_what_the_reader_does_not_know_refuses_nothing(printed):
    assert root_is_productive(printed) is None


@pytest.mark.parametrize("printed, productive", [
    ('root ::= ((Regex("^[a-z](x|\\)", json_string=true) "@"))', True),
    ("root ::= ((Token(1, 2) rest))\nrest ::= ((rest))", False),  # the unread element cannot save the sequence
    ('root ::= ((Regex("(") rest) | ("q"))\nrest ::= ((rest))', True),
])
def test_elements_whose_text_is_not_read_count_as_productive(printed, productive):
    assert root_is_productive(printed) is productive


@pytest.mark.parametrize("body, empty", [
    ("", True), ("^\\0-\\U0010ffff", True), ("^\\0-\\x1f -\\U0010ffff", True), ("^\\0-\\x1f!-\\U0010ffff", False),
    ("a-z", False), ("^\\-\\]", False), ("z-a", True), ("^\\x00-\\uffff\\U00010000-\\U0010ffff", True),
])
def test_character_class_emptiness(body, empty):
    assert class_is_empty(body) is empty


class _Req:
    def __init__(self, grammar):
        self.sampling_params = SamplingParams.from_dict({"temperature": 1.0, "max_new_tokens": 4})
        self.output_ids, self.stop_token_ids, self.return_logprob = [], {STOP}, False
        self.top_logprobs_num, self.generator, self.grammar = 0, None, grammar
        self.fill_ids = [1]


def test_a_row_that_allows_nothing_is_marked_and_cannot_fail_the_batch(byte_compiler):
    """A dead end (here the tokenizer gap is simulated by a grammar the edge would refuse) among live rows: it is
    marked on its grammar, its row is sampled like an unconstrained one (no NaN, no error), and the live rows keep
    their exact masks."""
    dead = RequestGrammar("regex", xgr.GrammarMatcher(compile_kind(byte_compiler, "regex", r"[^\s\S]")), lambda: None)
    live = RequestGrammar("regex", xgr.GrammarMatcher(compile_kind(byte_compiler, "regex", "q")), lambda: None)
    reqs = [_Req(live), _Req(dead), _Req(None)]
    bitmask = TokenBitmask.on_host(torch.zeros((3, 9), dtype=torch.int32))
    logits = torch.randn(3, 257)
    apply_grammar_mask_(logits, reqs, bitmask)
    assert dead.dead_end and not live.dead_end
    assert torch.isfinite(logits[1]).all()
    assert torch.isfinite(logits[0]).sum() == 1 and torch.isfinite(logits[0, ord("q")])
    out = sample(torch.randn(3, 257), reqs, bitmask)
    assert out.next_token_ids[0] == ord("q")
    msg = str(dead.dead_end_error(r"[^\s\S]"))
    assert msg.startswith("Invalid value for regex: the grammar admits no continuation after 0 tokens"), msg

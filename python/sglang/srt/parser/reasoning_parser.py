"""--reasoning-parser: a reasoning model's thoughts (`reasoning_content`) apart from its answer (`content`).

    deepseek-r1      <think> reasoning </think> answer; the chat template already opened the <think> block, so
                     the output usually starts inside it: everything before </think> is reasoning
    qwen3            reasoning only when the output opens with <think> (enable_thinking=false templates emit none)
    qwen3-thinking   like deepseek-r1 (Qwen3 *-Thinking checkpoints: the template opens the block)

Whitespace around the reasoning and before the answer is dropped. `feed(text, final)` reads the output as it
arrives and returns what may be sent now; text that could still be the start of a tag is held back, so the deltas of
a stream add up to exactly what the whole output gives (`split`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple

THINK_START = "<think>"
THINK_END = "</think>"
WHITESPACE = " \t\r\n"

# name -> does the output start inside the reasoning block
REASONING_PARSERS: Dict[str, bool] = {
    "deepseek-r1": True,
    "qwen3": False,
    "qwen3-thinking": True,
}


def _held(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a proper beginning of `marker`."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-k:]):
            return k
    return 0


@dataclass(frozen=True)
class ReasoningTags:
    """A parser's tags under upstream's attribute names (`ReasoningParser(name).detector.think_end_token`)."""

    think_start_token: str
    think_end_token: str
    force_reasoning: bool  # the output starts inside the block (the template opened it)


class ReasoningParser:
    def __init__(self, name: str):
        if name not in REASONING_PARSERS:
            raise ValueError(f"Unknown reasoning parser {name!r}; choose one of {', '.join(REASONING_PARSERS)}.")
        self.name = name
        self.starts_in_reasoning = REASONING_PARSERS[name]
        self.detector = ReasoningTags(THINK_START, THINK_END, self.starts_in_reasoning)
        self.state = "start"  # start -> reasoning -> content, or start -> content
        self.pending = ""  # text not yet sent: a possible tag, or blanks whose fate depends on what follows
        self.reasoning_started = False
        self.entered_reasoning = False  # the output had a reasoning block (reasoning_tokens.py counts its tokens)

    def feed(self, text: str, final: bool) -> Tuple[str, str]:
        """(reasoning delta, content delta)."""
        self.pending += text
        reasoning, content = [], []
        if self.state == "start":
            head = self.pending.lstrip(WHITESPACE)
            if head.startswith(THINK_START):
                self.pending, self.state = head[len(THINK_START):], "reasoning"
            elif THINK_START.startswith(head) and not final:
                return "", ""  # may still be the opening tag
            else:
                self.state = "reasoning" if self.starts_in_reasoning else "content"
        if self.state == "reasoning":
            self.entered_reasoning = True
            if not self.reasoning_started:
                self.pending = self.pending.lstrip(WHITESPACE)
                self.reasoning_started = bool(self.pending)
            end = self.pending.find(THINK_END)
            if end >= 0:
                reasoning.append(self.pending[:end].rstrip(WHITESPACE))
                self.pending, self.state = self.pending[end + len(THINK_END):].lstrip(WHITESPACE), "answer_start"
            elif final:
                reasoning.append(self.pending.rstrip(WHITESPACE))
                self.pending = ""
            else:  # hold a possible </think> and trailing blanks (dropped if </think> follows them)
                keep = len(self.pending) - _held(self.pending, THINK_END)
                keep = len(self.pending[:keep].rstrip(WHITESPACE))
                reasoning.append(self.pending[:keep])
                self.pending = self.pending[keep:]
        if self.state == "answer_start":
            self.pending = self.pending.lstrip(WHITESPACE)
            if self.pending:
                self.state = "content"
        if self.state == "content":
            content.append(self.pending)
            self.pending = ""
        return "".join(reasoning), "".join(content)

    def split(self, text: str) -> Tuple[str, str]:
        """A complete output -> (reasoning_content, content)."""
        return self.feed(text, final=True)

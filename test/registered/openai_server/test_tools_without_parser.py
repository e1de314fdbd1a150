"""On a server started without --tool-call-parser / --reasoning-parser (the shared test server): tools reach the
template and the reply stays plain content; a choice that needs a parser is a 400 naming tool_choice."""

import openai
import pytest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="cpu")

TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
ASK = [{"role": "user", "content": "What time is it?"}]


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_forced_choice_needs_a_parser(client, model_name, tool_choice):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_name, messages=ASK, tools=TOOLS, tool_choice=tool_choice,
                                       max_tokens=4)
    assert e.value.body["param"] == "tool_choice" and "--tool-call-parser" in e.value.body["message"]


def test_auto_is_plain_content(client, model_name):
    resp = client.chat.completions.create(model=model_name, messages=ASK, tools=TOOLS, max_tokens=6, temperature=0)
    msg = resp.choices[0].message
    assert msg.content and msg.tool_calls is None and msg.reasoning_content is None  # null without a parser

"""The structured-output requests both grammar backends' server tests send (test_structured_output_server.py for
xgrammar, test_llguidance_server.py), each output checked independently of the server: JSON parsed and validated
with `jsonschema` / pydantic, regexes fullmatched with Python's `re`."""

import json
import re
from typing import List, Literal

import jsonschema
import requests
from pydantic import BaseModel, Field

from schemas import SCHEMAS

MSG = [{"role": "user", "content": "Give me the weather in a European capital as JSON."}]
REGEX = r"[A-Z]{3}-[0-9]{3}"
GBNF = 'root ::= "answer: " ("yes" | "no")'


class Weather(BaseModel):
    city: Literal["Paris", "Rome", "Berlin"]
    temperature_c: int = Field(ge=-30, le=50)
    sunny: bool
    tags: List[Literal["wind", "rain", "sun"]] = Field(max_length=2)


def check_structured_requests(client, base_url: str, model: str) -> None:
    """Every request here must give a valid output (finish_reason "stop") under the server's backend."""
    parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
    for temperature in (0.0, 0.8):
        resp = parse(model=model, messages=MSG, response_format=Weather, max_tokens=64, temperature=temperature)
        assert resp.choices[0].finish_reason == "stop" and isinstance(resp.choices[0].message.parsed, Weather)
        assert Weather.model_validate_json(resp.choices[0].message.content) == resp.choices[0].message.parsed
    chat = client.chat.completions.create(model=model, messages=MSG, response_format={"type": "json_object"},
                                          max_tokens=48, temperature=0.8, seed=3)
    if chat.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(chat.choices[0].message.content), dict)
    else:
        assert chat.choices[0].message.content.startswith("{")
    streamed = client.chat.completions.create(model=model, messages=MSG, max_tokens=16, temperature=0, stream=True,
                                              extra_body={"regex": REGEX})
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert re.fullmatch(REGEX, text), text
    for schema in SCHEMAS[:6]:
        body = {"prompt": "Answer with JSON only:", "max_tokens": 64, "n": 2, "temperature": 0.8, "response_format":
                {"type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": True}}}
        r = requests.post(f"{base_url}/v1/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        for c in r.json()["choices"]:
            assert c["finish_reason"] == "stop", c
            jsonschema.validate(json.loads(c["text"]), schema)
    r = requests.post(f"{base_url}/generate", timeout=60,
                      json={"text": "Is the sky blue?", "sampling_params": {"ebnf": GBNF, "max_new_tokens": 8}})
    assert r.status_code == 200 and r.json()["text"] in ("answer: yes", "answer: no"), r.text


def scheduler_stats(base_url: str) -> dict:
    """The scheduler's stats in /server_info (num_faults, ...), with one scheduler or several."""
    info = requests.get(f"{base_url}/server_info", timeout=30).json()
    return info["scheduler"]["stats"] if "scheduler" in info else info["stats"]

"""Request models validate like OpenAI (strict types, ranges, unknown fields) and errors read as instructions."""

import pytest
from pydantic import ValidationError

from sglang.srt.entrypoints.openai.errors import describe_validation_error, error_body
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from sglang.srt.sampling.sampling_params import choice_sampling_params
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=2, suite="cpu")

MSG = [{"role": "user", "content": "hi"}]


def error_of(model, body):
    with pytest.raises(ValidationError) as e:
        model.model_validate(body)
    return describe_validation_error(e.value, model)


@pytest.mark.parametrize("extra,param,fragment", [
    ({"max_tokens": "5"}, "max_tokens", "valid integer"),  # strict: no string -> int coercion
    ({"n": True}, "n", "valid integer"),  # strict: a bool is not a number
    ({"temperature": 2.5}, "temperature", "less than or equal to 2"),
    ({"top_p": 0.0}, "top_p", "greater than 0"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4 items"),
    ({"stream_options": {"include_usage": True, "x": 1}}, "stream_options", "Unrecognized request argument"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "txt": "a"}]}]}, "messages", "text"),
])
def test_chat_validation_messages(extra, param, fragment):
    message, got_param = error_of(ChatCompletionRequest, {"messages": MSG, **extra})
    assert got_param == param and fragment in message, message


def test_union_errors_report_the_intended_alternative():
    message, param = error_of(CompletionRequest, {"prompt": [1, "a"]})
    assert param == "prompt" and message.count("Invalid value") == 1


def test_extensions_reach_sampling_params():
    req = ChatCompletionRequest.model_validate(
        {"messages": MSG, "top_k": 5, "min_p": 0.1, "ignore_eos": True, "seed": 7, "stop": "x", "max_tokens": 9}
    )
    sp = SamplingParams.from_dict(req.sampling_params(req.max_output_tokens))
    assert (sp.top_k, sp.min_p, sp.ignore_eos, sp.seed, sp.stop_strs, sp.max_new_tokens) == (5, 0.1, True, 7, ["x"], 9)
    assert choice_sampling_params(req.sampling_params(9), 2)["seed"] == 9


def test_unsupported_features_are_named():
    rf = ChatCompletionRequest.model_validate({"messages": MSG, "response_format": {"type": "json_object"}})
    assert rf.unsupported() is None and rf.sampling_params(8)["json_schema"] == '{"type": "object"}'  # issue 14
    assert CompletionRequest.model_validate({"prompt": "x", "best_of": 3}).unsupported()[0] == "best_of"
    assert CompletionRequest.model_validate({"prompt": "x"}).unsupported() is None


def test_one_set_of_rules_for_every_api():
    """The OpenAI models and /generate's sampling_params declare each field with the same Rule (same bounds, same
    "Allowed: ..." sentence), and an error reads the same on both."""
    from sglang.srt.entrypoints.openai.protocol import GenerateRequest
    from sglang.srt.sampling.sampling_params import SamplingParamsModel

    for name in ("temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty",
                 "repetition_penalty", "seed", "n", "stop", "stop_token_ids", "skip_special_tokens", "ignore_eos",
                 "spaces_between_special_tokens", "no_stop_trim", "stop_regex"):
        chat, native = ChatCompletionRequest.model_fields[name], SamplingParamsModel.model_fields[name]
        assert chat.description == native.description and chat.description.startswith("Allowed: "), name
        assert repr(chat.metadata) == repr(native.metadata), name
    chat_msg, _ = error_of(ChatCompletionRequest, {"messages": MSG, "repetition_penalty": 0.001})
    gen_msg, param = error_of(GenerateRequest, {"text": "x", "sampling_params": {"repetition_penalty": 0.001}})
    assert param == "sampling_params.repetition_penalty"
    assert gen_msg == chat_msg.replace("for repetition_penalty", "for sampling_params.repetition_penalty")
    assert "Allowed: a finite number in [0.01, 2] (1 is off)." in chat_msg


def test_cross_field_rules_name_the_field():
    message, param = error_of(ChatCompletionRequest, {"messages": MSG, "min_tokens": 9, "max_completion_tokens": 3})
    assert param == "min_tokens" and "should not exceed max_completion_tokens (3)" in message
    message, param = error_of(CompletionRequest, {"prompt": "x", "seed": 2**63 - 3, "n": 4})
    assert param == "seed" and "seed + 3" in message


def test_json_nesting_depth_counts_only_structure():
    from sglang.srt.entrypoints.openai.serving_base import json_nesting_depth

    assert json_nesting_depth(b'{"a": [[1], {"b": []}]}') == 4
    assert json_nesting_depth(b"[" * 100 + b"]" * 100) == 100
    # brackets inside strings, escaped quotes included, are text
    assert json_nesting_depth(b'{"p": "' + b"[{" * 100 + b'", "q": "a\\\\"}') == 1
    assert json_nesting_depth(b'{"p": "\\"' + b"[" * 100 + b'"}') == 1


def test_error_body_shape():
    body = error_body(404, "no such model", param="model", code="model_not_found")
    # OpenAI's nested object (what the openai client reads) and upstream SGLang's top-level ErrorResponse fields
    assert body == {"object": "error", "message": "no such model", "type": "NotFoundError", "param": "model",
                    "code": "model_not_found",
                    "error": {"message": "no such model", "type": "not_found_error", "param": "model",
                              "code": "model_not_found"}}
    assert error_body(400, "bad")["type"] == "BadRequestError" and error_body(400, "bad")["code"] == 400


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))

"""--chat-template refusals at launch: everything but a readable Jinja file that renders a one-message conversation
stops the start with a message naming the flag (the served path is in test_upstream_flags_server.py)."""

import subprocess
import sys

import pytest

from sglang.srt.server_args import ServerArgs
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=15, suite="cpu")

GOOD = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<a>{% endif %}"


def refusal(tmp_path, name: str, text=None) -> str:
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(ValueError) as e:
        ServerArgs(chat_template=str(path))
    message = str(e.value)
    assert "--chat-template" in message and str(path) in message
    return message


def test_a_template_file_that_renders_is_accepted(tmp_path):
    path = tmp_path / "ok.jinja"
    path.write_text(GOOD)
    assert ServerArgs(chat_template=str(path)).chat_template == str(path)


def test_missing_file_and_builtin_names_are_refused(tmp_path):
    assert "not a file" in refusal(tmp_path, "absent.jinja")
    with pytest.raises(ValueError, match="--chat-template 'chatml' is not a file.*built-in template names"):
        ServerArgs(chat_template="chatml")  # an upstream built-in name


def test_json_template_files_are_refused(tmp_path):
    assert "JSON" in refusal(tmp_path, "conv.json", '{"name": "x"}')


@pytest.mark.parametrize("text, said", [
    ("{% for m in messages %}{{ m.content }", "does not render"),  # jinja syntax error
    ("{{ raise_exception('roles must alternate') }}", "roles must alternate"),  # the template's own refusal
    ("<bos>{% if add_generation_prompt %}<a>{% endif %}", "without the message's text"),  # ignores the messages
    ("   \n", "is empty"),
])
def test_templates_that_cannot_render_are_refused(tmp_path, text, said):
    assert said in refusal(tmp_path, "bad.jinja", text)


def test_launch_stops_before_any_process_starts(tmp_path):
    """The real launcher: exit status 2 and the flag named on stderr, from argument parsing (no model load)."""
    out = subprocess.run([sys.executable, "-m", "sglang.launch_server", "--chat-template", str(tmp_path / "nope")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "--chat-template" in out.stderr and "is not a file" in out.stderr

"""--chat-template: a Jinja chat template file that replaces the tokenizer's own template.

Upstream's flag also takes the name of a built-in conversation template or a JSON file describing one; this runtime
renders only Jinja (the tokenizer's renderer, as for the model's own template), so anything but a readable template
file is refused at launch, as is a template that cannot render a one-message conversation: a bad template is the
operator's to fix before the server starts, not a 400 on every chat request.
"""

from __future__ import annotations

import os

FLAG = "--chat-template"
# rendered once at launch; a template that fails on this fails on any chat request
PROBE_CONVERSATION = [{"role": "user", "content": "Hello"}]


def read_chat_template_file(path: str) -> str:
    """The template text at `path`; ValueError naming the flag and what to change otherwise."""
    if path.endswith(".json"):
        raise ValueError(f"{FLAG} {path!r}: JSON conversation-template files are not supported; give a Jinja "
                         "template file (the text a tokenizer_config.json keeps under chat_template).")
    if not os.path.isfile(path):
        raise ValueError(f"{FLAG} {path!r} is not a file. Give the path of a Jinja chat template file (upstream's "
                         "built-in template names are not supported), or drop the flag to use the tokenizer's own.")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{FLAG} {path!r} could not be read as UTF-8 text: {e}") from e
    if not text.strip():
        raise ValueError(f"{FLAG} {path!r} is empty; give a Jinja chat template.")
    return text


def check_chat_template_file(path: str) -> str:
    """Read the file and render a probe conversation with transformers' own Jinja renderer; returns the text."""
    text = read_chat_template_file(path)
    from transformers.utils.chat_template_utils import render_jinja_template

    try:
        rendered, _ = render_jinja_template([PROBE_CONVERSATION], chat_template=text, add_generation_prompt=True)
    except Exception as e:  # jinja syntax errors, raise_exception(...) in the template, undefined filters
        raise ValueError(f"{FLAG} {path!r}: the template does not render a one-message conversation "
                         f"({type(e).__name__}: {e}). Fix the template or drop the flag.") from e
    if PROBE_CONVERSATION[0]["content"] not in rendered[0]:
        raise ValueError(f"{FLAG} {path!r}: the template rendered a one-message conversation without the message's "
                         "text (does it loop over `messages` and print each message's `content`?).")
    return text

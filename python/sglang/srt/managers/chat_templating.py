"""ChatTemplater: messages -> prompt text, off the event loop.

Two kinds of template, two places to run them:
    the model's own template (trusted: the tokenizer's,      a thread of the OffLoopExecutor
      or the operator's --chat-template file instead)
    a client's template (chat_template_kwargs.chat_template) refused (400) unless --allow-client-chat-template;
                                                             then a TemplateSandbox worker process, with a time
                                                             budget and an output budget
`chat_template_kwargs` otherwise become template variables; the keys that would change how the template is called
(tokenize, return_dict, ...) are refused with a 400 naming them.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from sglang.srt.managers.offloop_executor import OffLoopExecutor
from sglang.srt.managers.request_error import RequestError
from sglang.srt.managers.template_sandbox import TEMPLATE_PARAM, TemplateSandbox

# keys that are arguments of the rendering call, not template variables; the request's own fields set them
RESERVED_KWARGS = (
    "messages", "conversation", "add_generation_prompt", "continue_final_message", "tokenize", "return_dict",
    "return_tensors", "return_assistant_tokens_mask", "tokenizer_kwargs", "padding", "truncation", "max_length",
)


class ChatTemplater:
    def __init__(self, tokenizer: Any, executor: OffLoopExecutor, sandbox: Optional[TemplateSandbox],
                 server_template: Optional[str] = None):
        """`sandbox` None: client templates are refused. `server_template` (--chat-template's text) replaces the
        tokenizer's template (and its named ones) for every request."""
        self.tokenizer = tokenizer
        self.server_template = server_template
        self.executor = executor
        self.sandbox = sandbox

    def named_templates(self) -> Dict[str, str]:
        """A tokenizer may ship several templates by name (e.g. "default", "tool_use"); choosing one is allowed."""
        t = getattr(self.tokenizer, "chat_template", None)
        return t if isinstance(t, dict) and self.server_template is None else {}

    async def apply(
        self,
        messages: List[dict],
        tools: Optional[list] = None,
        continue_final_message: bool = False,
        template_kwargs: Optional[dict] = None,
    ) -> str:
        if self.tokenizer is None:
            raise RequestError(400, "This server runs without a tokenizer (--skip-tokenizer-init); use /generate with input_ids.")
        kwargs = dict(template_kwargs or {})
        for key in RESERVED_KWARGS:
            if key in kwargs:
                raise RequestError(
                    400, f"chat_template_kwargs.{key} is not a template variable; it is set by the request itself "
                    "(messages, continue_final_message, ...). Remove it.", param=f"chat_template_kwargs.{key}",
                )
        client_template = kwargs.pop("chat_template", None)
        if client_template is not None and not (isinstance(client_template, str) and client_template in self.named_templates()):
            return await self._apply_client_template(client_template, messages, tools, continue_final_message, kwargs)
        if self.server_template is not None:
            kwargs["chat_template"] = self.server_template
        elif getattr(self.tokenizer, "chat_template", None) is None:
            raise RequestError(400, "The model has no chat template; use /v1/completions instead, or start the "
                               "server with --chat-template <a Jinja template file>.")
        elif client_template is not None:
            kwargs["chat_template"] = client_template  # the name of one of the model's own templates
        if tools:
            kwargs["tools"] = tools
        return await self.executor.run(self._render_model_template, messages, continue_final_message, kwargs)

    def _render_model_template(self, messages: List[dict], continue_final_message: bool, kwargs: dict) -> str:
        try:
            return self.tokenizer.apply_chat_template(
                messages,
                tokenize=False,
                add_generation_prompt=not continue_final_message,
                continue_final_message=continue_final_message,
                **kwargs,
            )
        except Exception as e:  # jinja errors (e.g. roles out of order) are the caller's to fix
            raise RequestError(400, f"The chat template rejected the messages: {e}", param="messages") from e

    async def _apply_client_template(
        self, template: Any, messages: List[dict], tools: Optional[list], continue_final_message: bool, kwargs: dict
    ) -> str:
        if self.sandbox is None:
            raise RequestError(
                400,
                f"{TEMPLATE_PARAM} replaces the model's chat template, and this server does not accept templates "
                "from clients. Remove it (the model's own template is used), or start the server with "
                "--allow-client-chat-template to render client templates in a sandbox.",
                param=TEMPLATE_PARAM,
            )
        if not isinstance(template, str):
            raise RequestError(400, f"{TEMPLATE_PARAM} must be a string (a jinja template).", param=TEMPLATE_PARAM)
        context = {**self.special_tokens(), **kwargs, "messages": messages, "tools": tools,
                   "add_generation_prompt": not continue_final_message}
        text = await self.sandbox.render(template, context)
        return cut_after_final_message(text, messages) if continue_final_message else text

    def special_tokens(self) -> Dict[str, str]:
        """bos_token, eos_token, ... as template variables, as the tokenizer's own rendering provides them."""
        tokens = getattr(self.tokenizer, "special_tokens_map", None) or {}
        return {k: v for k, v in tokens.items() if isinstance(v, str)}


def cut_after_final_message(text: str, messages: List[dict]) -> str:
    """continue_final_message: the prompt ends with the last message's text, so the model continues it."""
    content = messages[-1].get("content") if messages else None
    if not isinstance(content, str) or not content.strip():
        return text
    at = text.rfind(content.strip())
    if at < 0:
        raise RequestError(
            400, "continue_final_message is set, but the chat template did not render the final message's text.",
            param="continue_final_message",
        )
    return text[: at + len(content.strip())]

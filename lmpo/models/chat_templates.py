"""A tokenizer's chat template from a file (`--chat_template`) and template variables written into it
(`--chat_template_kwargs`), each refused at once when the template cannot render with them."""

from __future__ import annotations

import json
from pathlib import Path

from transformers import PreTrainedTokenizerBase


def set_chat_template(tok: PreTrainedTokenizerBase, path: str) -> None:
    """Gives `tok` the template in the file `path`, refused at once (rather than at the first row
    of data) when it cannot render a one-message conversation."""
    try:  # the file is kept for messages about the template (`lmpo.rollout.render`)
        tok.chat_template, tok._lmpo_chat_template_file = Path(path).read_text(encoding="utf-8"), path
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"--chat_template {path}: cannot read it ({err})") from None
    _check_renders(tok, f"--chat_template {path}: the template cannot render a one-message conversation")


def _check_renders(tok: PreTrainedTokenizerBase, refusal: str) -> None:
    """Refuses, at once rather than at the first row of data, a template that cannot render a
    one-message conversation; `refusal` says which option gave it."""
    try:
        tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    except Exception as err:  # jinja2's TemplateError and whatever the template raises
        line = f" (line {err.lineno})" if getattr(err, "lineno", None) else ""
        raise ValueError(f"{refusal}{line}: {err}") from None


RENDERER_VARIABLES = ("messages", "tools", "documents", "add_generation_prompt", "continue_final_message")
"""Variables every render passes itself: set in the template, they would override each call's."""


def set_template_variables(tok: PreTrainedTokenizerBase, text: str) -> None:
    """Prepends a `{% set name = value %}` per key of the JSON object `text` to the tokenizer's
    template. A variable set at the template's top wins over one passed at render time, so the
    data, the prompts, the rollouts and the saved model all render with these values: what
    transformers' `apply_chat_template(..., enable_thinking=False)` does for one call."""
    flag = "--chat_template_kwargs"
    try:
        variables = json.loads(text)
    except ValueError as err:
        raise ValueError(f"{flag} {text!r}: expected a JSON object such as '{{\"enable_thinking\": false}}' "
                         f"({err})") from None
    if not isinstance(variables, dict) or not variables:
        raise ValueError(f"{flag} {text!r}: expected a JSON object of template variables, got "
                         f"{type(variables).__name__ if variables != {} else 'an empty one'}")
    for name in variables:
        if not name.isidentifier() or name in RENDERER_VARIABLES:
            raise ValueError(f"{flag}: {name!r} cannot be set: expected a template variable's name, not one of "
                             f"{', '.join(RENDERER_VARIABLES)} (which lmpo passes itself)")
    if not getattr(tok, "chat_template", None):
        raise ValueError(f"{flag}: the tokenizer has no chat template to pass them to (give one with --chat_template)")
    preamble = "".join(f"{{%- set {name} = {_jinja_literal(value)} %}}" for name, value in variables.items())
    templates = tok.chat_template
    if isinstance(templates, dict):  # named templates (a default and a tool-use one, say): each gets them
        tok.chat_template = {key: preamble + value for key, value in templates.items()}
    else:
        tok.chat_template = preamble + templates
    _check_renders(tok, f"{flag}: the template cannot render a one-message conversation with them")


def _jinja_literal(value) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(map(_jinja_literal, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {_jinja_literal(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)  # a number or a string: JSON's escapes are Jinja's too

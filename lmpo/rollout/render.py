"""Token-in / token-out rendering of conversations.

The model's tokens are appended exactly as sampled and never decoded and encoded again (that
changes ids at turn boundaries: BPE merges across them, templates add whitespace, and the
log-prob ratios go wrong). Only what the environment and the chat template add is tokenised:
the conversation is rendered with the new messages, the text already held is cut off the
front, and just that suffix is encoded. Each suffix token is labelled ENV when it lies inside
an observation's text, TEMPLATE otherwise (role markers, newlines, the generation prompt).

That needs a template that renders a conversation's prefix unchanged when messages are added
(prefix-preserving). `check_prefix_preserving` renders canned conversations both ways at
start-up and refuses templates that are not (e.g. ones that drop earlier reasoning blocks).
"""

from __future__ import annotations

import functools
import warnings
from typing import NamedTuple, Sequence

from lmpo.envs.data.chat import starting
from lmpo.rollout.trajectory import ENV, TEMPLATE


class TemplateError(ValueError):
    """The chat template cannot be used for token-in/token-out multi-turn rollouts."""


class Suffix(NamedTuple):
    """What new messages and the next generation prompt add to a conversation."""

    ids: list[int]
    sources: list[int]
    """ENV or TEMPLATE per id."""
    text: str
    conversation: str
    """The whole conversation as the template renders it now: what later turns continue from. It
    differs from the held text plus `text` only where the template trimmed the model's turn."""


class TextRenderer:
    """No chat template: the prompt is the problem's text as written, after the tokenizer's
    leading special tokens (its BOS, where it adds one); observations are appended as plain text."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        # a GRPO group renders one prompt group_size times, every step: tokenized once
        self._ids = functools.lru_cache(maxsize=4096)(
            lambda text: tuple(starting(self.tokenizer, self.tokenizer(text, add_special_tokens=False).input_ids)))

    def prompt(self, messages: list[dict]) -> tuple[list[int], str]:
        text = "".join(m["content"] for m in messages)
        return list(self._ids(text)), text

    def suffix(self, held_text: str, messages: list[dict], new: list[dict]) -> Suffix:
        text = "".join(m["content"] for m in new)
        ids = self.tokenizer(text, add_special_tokens=False).input_ids
        return Suffix(ids, [ENV] * len(ids), text, held_text + text)


class ChatRenderer:
    """Renders with the tokenizer's chat template (with the tools' schemas when given)."""

    def __init__(self, tokenizer, tools: Sequence[dict] | None = None):
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError("this task is a conversation, but the tokenizer has no chat template; give one "
                                "with --chat_template FILE (a Jinja template), or use a model whose tokenizer has one")
        self.tokenizer, self.tools = tokenizer, list(tools) if tools else None
        self.turn_end: str | None = None
        """The stop token's text the template closes an assistant turn with (`check_prefix_preserving`)."""
        added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        specials = {t.content for t in added.values() if getattr(t, "special", False)} | set(tokenizer.all_special_tokens)
        self._specials = sorted(specials, key=len, reverse=True)  # `<|im_end|>` before a shorter token it ends with
        self._anchor_ids: dict[str, list[int]] = {}

    def render(self, messages: list[dict], generation_prompt: bool) -> str:
        kwargs = {"tools": self.tools} if self.tools else {}
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt,
                                                  **kwargs)

    def prompt(self, messages: list[dict]) -> tuple[list[int], str]:
        text = self.render(messages, True)
        return starting(self.tokenizer, self.tokenizer(text, add_special_tokens=False).input_ids), text

    def suffix(self, held_text: str, messages: list[dict], new: list[dict]) -> Suffix:
        """Ids and sources of what `new` messages and the next generation prompt add after `held_text`."""
        text = self.render([*messages, *new], True)
        base = held_text if text.startswith(held_text) else self._trimmed_turn(held_text, messages, text)
        if base is None:
            raise TemplateError("the chat template rendered the conversation so far differently once new messages "
                                f"were added (first difference at character {_first_difference(held_text, text)}); "
                                "it is not prefix-preserving")
        suffix = text[len(base):]
        ids, offsets = self._encode_after(base, suffix)
        spans = self._content_spans(base, messages, new, suffix)
        sources = [ENV if any(a < end and b > start for a, b in spans) else TEMPLATE for start, end in offsets]
        return Suffix(ids, sources, suffix, text)

    def _encode_after(self, base: str, suffix: str) -> tuple[list[int], list[tuple[int, int]]]:
        """The suffix's ids (and character offsets) as encoding the whole conversation gives them.
        Encoded alone, a SentencePiece tokenizer that marks only the first word of a text
        (`Metaspace(prepend_scheme="first")`: Mistral, Llama with `legacy=False`) writes `▁\n` where,
        after the turn's closing special token, the whole text has `\n`; so the suffix is encoded
        after that token and the token's own ids are dropped."""
        anchor = next((t for t in self._specials if base.endswith(t)), None)
        if anchor:
            head = self._anchor_ids.get(anchor)
            if head is None:  # once per special token: the rollout calls this for every observation
                head = self._anchor_ids[anchor] = self.tokenizer(anchor, add_special_tokens=False).input_ids
            both = self.tokenizer(anchor + suffix, add_special_tokens=False, return_offsets_mapping=True)
            if both["input_ids"][:len(head)] == head:
                return both["input_ids"][len(head):], [(a - len(anchor), b - len(anchor))
                                                       for a, b in both["offset_mapping"][len(head):]]
        encoded = self.tokenizer(suffix, add_special_tokens=False, return_offsets_mapping=True)
        return encoded["input_ids"], encoded["offset_mapping"]


    def _trimmed_turn(self, held_text: str, messages: list[dict], text: str) -> str | None:
        """Where the template's text of the model's last turn ends, when the template only trimmed
        that turn's leading or trailing whitespace (Llama 3's `content | trim`): the model's own
        ids stay as sampled, and the suffix is what the template writes after the turn. None when
        anything else differs."""
        if not self.turn_end or not messages or messages[-1].get("role") != "assistant":
            return None
        content = messages[-1].get("content") or ""
        if not held_text.endswith(content + self.turn_end):
            return None
        before = held_text[:len(held_text) - len(content) - len(self.turn_end)]
        core = content.strip()
        at = text.find(core, len(before)) if text.startswith(before) else -1
        if at < 0 or text[len(before):at].strip():
            return None
        end = text.find(self.turn_end, at + len(core))
        if end < 0 or text[at + len(core):end].strip():
            return None
        return text[:end + len(self.turn_end)]

    def _content_spans(self, held_text: str, messages: list[dict], new: list[dict], suffix: str) -> list[tuple]:
        """Where each new message's content lies in `suffix`. A content found exactly once is where
        the search finds it; otherwise (a tool whose output is `user` or `tool_response` also
        matches a role marker) one more render with a marker in place of each content says. A
        template that changes the content as it renders it (trims it, say) falls back to the search."""
        contents = [message.get("content") or "" for message in new]
        if all(suffix.count(content) == 1 for content in contents if content):
            return _searched_spans(contents, suffix)  # unambiguous: no second render on the rollout path
        marks = [f"\ue000{k}\ue001" for k in range(len(new))]
        marked = self.render([*messages, *({**m, "content": mark} for m, mark in zip(new, marks))], True)
        if not marked.startswith(held_text):
            return _searched_spans(contents, suffix)
        spans, shift = [], 0
        for content, mark in zip(contents, marks):
            at = marked.find(mark, len(held_text))
            start = at - len(held_text) + shift
            if at < 0 or suffix[start:start + len(content)] != content:
                return _searched_spans(contents, suffix)
            if content:
                spans.append((start, start + len(content)))
            shift += len(content) - len(mark)
        return spans


def _searched_spans(contents: list[str], suffix: str) -> list[tuple[int, int]]:
    """Each content's first occurrence in `suffix` after the previous one's."""
    spans, cursor = [], 0
    for content in contents:
        at = suffix.find(content, cursor) if content else -1
        if at >= 0:
            spans.append((at, at + len(content)))
            cursor = at + len(content)
    return spans


def _first_difference(a: str, b: str) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def _excerpt(text: str, at: int, width: int = 24) -> str:
    return repr(text[max(0, at - width):at + width])


def _where_it_differs(renderer: "ChatRenderer", before: list[dict], reply: str, at: int, later: bool,
                      rendered: str) -> str:
    """The likely cause, by which part of the held text the first difference falls in (at the
    reply's first character: text the template writes before the reply, or the reply rewritten)."""
    try:
        history = len(renderer.render(before, False))
    except Exception:  # a template that cannot end on a user or tool turn without the prompt
        history = 0
    prompt = len(renderer.render(before, True))
    if at < history:
        return "The template rewrites an earlier turn (e.g. drops the reasoning of past assistant turns)."
    if at < prompt or (at == prompt and reply and reply in rendered[at:at + len(reply) + 40]):
        return ("The generation prompt differs from how the template renders the start of an assistant turn "
                "(e.g. an empty <think> block only in the prompt, or whitespace a {%- tag strips).")
    if later:
        return ("Once a later turn follows, the template renders this assistant turn otherwise (e.g. drops the "
                "reasoning of past assistant turns).")
    if at < prompt + len(reply):
        return "The template rewrites the reply's own text (e.g. trims it, or removes its reasoning block)."
    return "The template ends an assistant turn otherwise than with the stop token the model samples."


CANNED = [
    {"role": "system", "content": "You answer with tools."},
    {"role": "user", "content": "What is 12 times 34?"},
    {"role": "assistant", "content": "<think>I should compute it.</think>calculator(12*34)"},
    {"role": "tool", "content": "408"},
    {"role": "assistant", "content": "<think>Done.</think>The answer is 408."},
    {"role": "user", "content": "And 2 times 3?"},
    {"role": "assistant", "content": "6"},
]


def check_prefix_preserving(renderer: ChatRenderer, eos_text: str | Sequence[str]) -> None:
    """Refuse a template under which the agent loop's held text would stop being a prefix of
    the rendered conversation: after each assistant turn (the generation prompt, the reply,
    then the EOS the model samples) and after each observation. `eos_text`: the texts of the
    tokens generation stops at; the one the template closes assistant turns with becomes
    `renderer.turn_end`."""
    candidates = [eos_text] if isinstance(eos_text, str) else list(eos_text)
    canned = _canned_for(renderer)
    eos_text = renderer.turn_end = _closing_stop(renderer, candidates, canned)
    for i, message in enumerate(canned):
        if message["role"] != "assistant" or i == 0:
            continue
        before = canned[:i]
        try:
            held = renderer.render(before, True) + message["content"] + eos_text
            after = renderer.render(canned[:i + 1], False)
            nxt = renderer.render(canned[:i + 2], True) if i + 1 < len(canned) else after
        except Exception as err:  # a template that refuses the tool role or the canned turns
            raise TemplateError(_unrenderable(err)) from err
        for name, text in (("the reply", after), ("the next turn", nxt)):
            if not text.startswith(held):
                at = _first_difference(held, text)
                cause = _where_it_differs(renderer, before, message["content"], at, name == "the next turn", text)
                raise TemplateError(
                    "the tokenizer's chat template is not prefix-preserving: rendering the conversation with "
                    f"{name} added changes the text of turn {i} at character {at}: the agent loop holds "
                    f"{_excerpt(held, at)} where the template then renders {_excerpt(text, at)}. "
                    f"{cause} Multi-turn rollouts append "
                    "the model's own tokens to the text held so far, so they cannot use this template; pass "
                    "--chat_template FILE with one that renders each turn as the generation prompt began it")
        following = canned[i + 1] if i + 1 < len(canned) else None
        if following is not None and following["content"] not in nxt[len(held):]:
            raise TemplateError(f"the chat template drops {following['role']} messages: rendered after an assistant "
                                f"turn, a {following['role']} message's text ({following['content']!r}) does not "
                                "appear, so a tool's output would never reach the model; use a template that "
                                f"renders the {following['role']} role")


def _unrenderable(err: Exception) -> str:
    return (f"the chat template cannot render a tool-use conversation: {err}; agent tasks need a template that "
            "renders user, assistant and tool turns (a tool turn after an assistant turn): give one with "
            "--chat_template FILE (a Jinja template)")


def _canned_for(renderer: ChatRenderer) -> list[dict]:
    """`CANNED`, without its system turn for a template that refuses one (Gemma's): the tasks'
    conversations need none, so such a template is judged on the turns they have."""
    try:
        renderer.render(CANNED[:2], True)
    except Exception:  # a template raises what it likes: jinja's TemplateError, its own exceptions
        return CANNED[1:]
    return CANNED


def _closing_stop(renderer: ChatRenderer, candidates: list[str], canned: list[dict] = CANNED) -> str:
    """Which stop token the template writes after an assistant turn's text (the first candidate
    when it writes none of them: the prefix check then says what differs)."""
    i = next(k for k, m in enumerate(canned) if m["role"] == "assistant")
    try:
        head = renderer.render(canned[:i], True) + canned[i]["content"]
        after = renderer.render(canned[:i + 1], False)
    except Exception as err:  # a template that refuses the canned turns
        raise TemplateError(_unrenderable(err)) from err
    written = after[len(head):] if after.startswith(head) else ""
    closing = next((text for text in candidates if text and written.startswith(text)), None)
    if closing is None and after.startswith(head) and written:
        template = _template_named(renderer.tokenizer)
        padded = next((text for text in candidates if text and written.lstrip().startswith(text)), None)
        if padded is not None:  # the stop token is the template's; the whitespace before it is the fault
            gap = written[:len(written) - len(written.lstrip())]
            raise TemplateError(f"{template} writes {gap!r} between an assistant turn's text and {padded!r}, so a "
                                f"turn the model ends with {padded!r} never matches the template's text of it; "
                                f"remove the {gap!r} before {padded!r} from the template")
        raise TemplateError(f"{template} ends an assistant turn with {written[:20]!r}, which is not the text "
                            f"of a token generation stops at ({', '.join(map(repr, candidates))}), so a turn the "
                            f"model ends does not read as the template's; name the template's end-of-turn token "
                            f"as a stop token (the model's generation_config.json eos_token_id)")
    return closing or candidates[0]


def _template_named(tokenizer) -> str:
    """'the chat template', naming its file where `--chat_template FILE` gave it."""
    path = getattr(tokenizer, "_lmpo_chat_template_file", None)
    return f"the chat template ({path}, given by --chat_template)" if path else "the chat template"


def renderer_for(task, tokenizer, stop_ids: Sequence[int] | None = None) -> TextRenderer | ChatRenderer:
    """The task's renderer: its chat template (checked to be prefix-preserving) for conversation
    tasks, else plain text. `stop_ids`: the tokens the engine stops at (default: the tokenizer's EOS)."""
    from lmpo.envs.env import tool_schemas, uses_chat_template
    from lmpo.envs.plugins import spec_with_option
    from lmpo.envs.registry import is_named

    if not uses_chat_template(task):
        return TextRenderer(tokenizer)
    renderer = ChatRenderer(tokenizer, tool_schemas(task))
    if renderer.tools and "<tool_call>" in str(tokenizer.chat_template) \
            and getattr(getattr(task, "fmt", None), "name", None) == "compact":
        spec = getattr(task, "spec", None) or "calculator"
        warnings.warn(f"the chat template shows the tools with <tool_call> blocks (hermes), but task "
                      f"{getattr(task, 'name', '')!r} reads calls written as name(arguments); a model that writes "
                      f"what the template teaches gets a parse error each time. For lmpo's tool tasks pass "
                      f"tool_format=hermes (--task {spec_with_option(spec, 'tool_format=hermes', is_named)})",
                      stacklevel=2)
    stops = list(stop_ids) if stop_ids else [tokenizer.eos_token_id]
    check_prefix_preserving(renderer, [tokenizer.decode([i], skip_special_tokens=False) for i in stops])
    return renderer

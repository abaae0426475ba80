"""Messages and chat templates: validating message lists, rendering them with the
tokenizer's own template, and finding which tokens belong to assistant turns.

Assistant tokens are found by rendering the conversation prefix by prefix (the turns before
an assistant reply with the generation prompt, then the turns through that reply) and
diffing the token ids against the whole conversation's. A turn's loss span runs from the
end of the generation prompt through the last end-of-turn token the template renders in that
turn (the tokenizer's eos, or another token the model's generation config stops on, such as
Gemma's `<end_of_turn>`), so formatting the template adds after it (a newline) carries no loss.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

from lmpo.envs.data import formats
from lmpo.envs.data.records import DataError, Record, short_repr, type_name
from lmpo.envs.data.encoding import encode, encode_start, leading_ids, starting  # noqa: F401 (chat's API)

try:
    from jinja2 import TemplateError  # what templates raise for messages they refuse
except ImportError:  # transformers then cannot render templates at all
    TemplateError = ValueError

ROLES = ("system", "user", "assistant", "tool")
TURN_FLAGS = ("weight", "train", "trainable", "loss")  # other tools' per-turn loss switches, which lmpo does not read
MESSAGES = "a list of {role, content} objects"


def has_chat_template(tokenizer: PreTrainedTokenizerBase | None) -> bool:
    return tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))


def message(rec: Record, where: str, value: Any) -> dict[str, Any]:
    """A validated {role, content} message, keeping only the keys chat templates read: an
    assistant turn's `tool_calls` (OpenAI's shape; its content may then be empty or null) and
    `reasoning_content`, a tool turn's `tool_call_id` and `name`. Content given as OpenAI's text
    parts becomes one string (`text_parts`). A per-turn loss flag other tools read (`weight`,
    `train`) is refused rather than ignored. Columnar formats give every message
    every key seen in the column, filled with nulls: those count as absent. A ShareGPT turn
    (`{"from": "human", "value": ...}`) is read as the message it stands for (`formats`)."""
    if formats.is_sharegpt_turn(value):
        value = formats.sharegpt_turn(rec, where, value)
    if not isinstance(value, dict):
        raise rec.error(where, "a {role, content} object", type_name(value))
    role, content = value.get("role"), value.get("content")
    if "role" not in value and "content" not in value:  # {"text": ...}: not a message at all
        keys = ", ".join(repr(k) for k in list(value)[:5])  # none: `{}`
        raise rec.error(where, "a {role, content} message object", f"an object with keys {keys}" if value else "{}")
    if role not in ROLES:
        raise rec.error(f"{where}.role", "one of 'system', 'user', 'assistant', 'tool'", _value(value, "role"))
    calls = value.get("tool_calls")
    if calls is not None and role != "assistant":
        raise rec.error(f"{where}.tool_calls", "tool calls only in an assistant turn", f"a {role} turn with them")
    calls = tool_calls(rec, f"{where}.tool_calls", calls) if calls is not None else []
    if content is None and calls:
        content = ""
    if isinstance(content, list):
        content = text_parts(rec, f"{where}.content", content)
    if not isinstance(content, str):
        raise rec.error(f"{where}.content", "a string", _value(value, "content") if content is None else type_name(content))
    if role == "assistant" and not content and not calls:
        raise rec.error(f"{where}.content", "a non-empty string in an assistant turn (or tool_calls)", "''")
    for key in TURN_FLAGS:
        if value.get(key) is not None:
            raise rec.error(f"{where}.{key}", "no per-turn loss flag (every assistant turn is trained; drop the "
                                              "turns not to train on, or make them part of the prompt)",
                            short_repr(value[key]))
    msg: dict[str, Any] = {"role": role, "content": content}
    if calls:
        msg["tool_calls"] = calls
    if role == "assistant" and value.get("reasoning_content") is not None:
        msg["reasoning_content"] = _string(rec, f"{where}.reasoning_content", value["reasoning_content"])
    for key in ("tool_call_id", "name") if role == "tool" else ():
        if value.get(key) is not None:
            msg[key] = _string(rec, f"{where}.{key}", value[key])
    return msg


def _value(message: dict, key: str) -> str:
    if key not in message:
        return f"no {key} field (the message has: {', '.join(map(str, message)) or 'none'})"
    return "null" if message[key] is None else short_repr(message[key])


def tool_calls(rec: Record, where: str, value: Any) -> list[dict[str, Any]]:
    """OpenAI-style calls, `[{"type": "function", "function": {"name", "arguments"}}]` (also the
    flat `{"name", "arguments"}`), as templates read them: arguments a JSON object, parsed where
    the file holds it as a string; an `id` is kept."""
    if not isinstance(value, list) or not value:
        raise rec.error(where, "a non-empty list of tool calls", type_name(value) if value != [] else "an empty list")
    calls = []
    for i, call in enumerate(value):
        at = f"{where}[{i}]"
        if not isinstance(call, dict):
            raise rec.error(at, 'a {"type": "function", "function": {"name", "arguments"}} object', type_name(call))
        function, at_function = (call.get("function"), f"{at}.function") if "function" in call else (call, at)
        if not isinstance(function, dict):
            raise rec.error(at_function, "an object with name and arguments", type_name(function))
        name = _string(rec, f"{at_function}.name", function.get("name"))
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError:
                raise rec.error(f"{at_function}.arguments", "a JSON object (or its JSON text)",
                                short_repr(arguments)) from None
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise rec.error(f"{at_function}.arguments", "a JSON object (or its JSON text)", type_name(arguments))
        rec.refuse_lone_surrogates(at_function, {"name": name, "arguments": arguments})
        out: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": arguments}}
        if isinstance(call.get("id"), str):
            out["id"] = call["id"]
        calls.append(out)
    return calls


def text_parts(rec: Record, where: str, parts: list) -> str:
    """OpenAI's content parts, `[{"type": "text", "text": ...}, ...]`, as one string: the texts
    joined by newlines, as vLLM renders them for a text-only model. Any other part (an image)
    is refused: lmpo trains text models."""
    texts = []
    for i, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            got = f"a part of type {kind!r}" if kind else type_name(part)
            raise rec.error(f"{where}[{i}]", 'a text part, {"type": "text", "text": "..."} (lmpo trains on text)', got)
        texts.append(part["text"])
    return "\n".join(texts)


def _string(rec: Record, where: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise rec.error(where, "a non-empty string", type_name(value) if value != "" else "''")
    return value


def messages(rec: Record, field: str, value: Any) -> list[dict[str, str]]:
    if not isinstance(value, list):
        raise rec.error(field, MESSAGES, type_name(value))
    if not value:
        raise rec.error(field, MESSAGES, "an empty list")
    return [message(rec, f"{field}[{i}]", m) for i, m in enumerate(value)]


def conversation(rec: Record, field: str, value: Any) -> list[dict[str, str]]:
    """Messages for SFT: at least one assistant turn, and none before the first prompt turn."""
    msgs = messages(rec, field, value)
    roles = [m["role"] for m in msgs]
    if "assistant" not in roles:
        raise rec.error(field, "at least one assistant turn", f"roles {', '.join(roles)}")
    if roles[0] == "assistant":
        raise rec.error(f"{field}[0].role", "a system or user turn before the first assistant turn", "'assistant'")
    return msgs


def reply(rec: Record, field: str, value: Any, prompt: list[dict[str, str]]) -> dict[str, str]:
    """The assistant reply in a completion/chosen/rejected field: a string, one assistant
    message, or a list holding one assistant message, optionally after the prompt's messages."""
    if isinstance(value, str):
        if not value:
            raise rec.error(field, "a non-empty string", "''")
        msg = {"role": "assistant", "content": value}
    elif isinstance(value, dict):
        msg = message(rec, field, value)
    elif isinstance(value, list):
        msgs = messages(rec, field, value)
        if len(msgs) > 1 and msgs[:-1] != prompt:
            raise rec.error(field, "one assistant message, or the prompt's messages then one assistant message",
                            f"{len(msgs)} messages that do not start with the prompt")
        msg = msgs[-1]
        field = f"{field}[{len(msgs) - 1}]"
    else:
        raise rec.error(field, "a string, an assistant message or a list of messages", type_name(value))
    if msg["role"] != "assistant":
        raise rec.error(f"{field}.role", "'assistant'", short_repr(msg["role"]))
    return msg


def render(rec: Record, field: str, tokenizer: PreTrainedTokenizerBase, msgs: list[dict[str, str]],
           *, generation_prompt: bool) -> str:
    if not has_chat_template(tokenizer):
        raise no_template(rec, field)
    tools = row_tools(rec)
    try:
        return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=generation_prompt,
                                             **({"tools": tools} if tools else {}))
    except (TemplateError, ValueError) as e:
        raise DataError(rec.path, f"the tokenizer's chat template rejects these messages: {e}",
                        row=rec.row, line=rec.line, field=rec.named(field)) from e


def no_template(rec: Record, field: str) -> DataError:
    return rec.error(field, "a tokenizer with a chat template to render messages",
                     "a tokenizer without one; give one with --chat_template FILE (a Jinja template)")


def row_tools(rec: Record) -> list[dict] | None:
    """The row's `tools` column: function schemas the template shows the model (None without one)."""
    tools = rec.get("tools")
    if tools is None:
        return None
    if isinstance(tools, str):  # datasets often keep schemas of many shapes as one JSON text
        try:
            tools = json.loads(tools) if tools.strip() else []
        except ValueError:
            raise rec.error("tools", "a list of function schemas (JSON objects, or their JSON text)",
                            short_repr(tools)) from None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise rec.error("tools", "a list of function schemas (JSON objects, or their JSON text)", type_name(tools))
    rec.refuse_lone_surrogates("tools", tools)
    return tools or None


def _check_calls_rendered(rec: Record, field: str, tokenizer: PreTrainedTokenizerBase, msgs: list[dict[str, Any]],
                          text: str) -> None:
    """A template that ignores `tool_calls` or `reasoning_content` would train the model on turns
    without them."""
    for key, what in (("tool_calls", "calls"), ("reasoning_content", "reasoning")):
        if not any(key in m for m in msgs):
            continue
        bare = [{k: v for k, v in m.items() if k != key} for m in msgs]
        if render(rec, field, tokenizer, bare, generation_prompt=False) == text:
            raise DataError(rec.path, f"the tokenizer's chat template does not render {key}, so the model would "
                                      f"learn these turns without their {what}; write it into the turn's content in "
                                      "the format the model should learn, or use a template that renders it",
                            row=rec.row, line=rec.line, field=rec.named(field))


def check_messages_rendered(rec: Record, field: str, tokenizer: PreTrainedTokenizerBase,
                            msgs: list[dict[str, Any]], text: str, *, generation_prompt: bool = False) -> None:
    """A template without a branch for a role (no `tool` in it, say) drops those messages, and
    the model would learn the replies that follow them without seeing them. Refused, not warned:
    leaving such messages out of the data trains on the very same text, and says so. Assistant
    turns are left to the masking, which finds each one (a template may rewrite them: Qwen3
    drops earlier turns' thinking). Cheap: a content found verbatim is rendered; only a content
    not found (trimmed, escaped, or dropped) costs one more rendering, with that content changed."""
    for i, msg in enumerate(msgs):
        content = msg["content"].strip()
        if msg["role"] == "assistant" or not content or content in text:
            continue
        probe = [*msgs[:i], {**msg, "content": "lmpo probe: the template drops this"}, *msgs[i + 1:]]
        if render(rec, field, tokenizer, probe, generation_prompt=generation_prompt) == text:
            role = msg["role"]
            raise DataError(rec.path, f"message {i + 1} (role {role!r}) does not appear in the chat template's "
                                      f"rendering (the template has no branch for role {role!r}, or leaves its content "
                                      f"out), so the model would "
                                      f"learn the turns after it without it; give --chat_template FILE with a template "
                                      f"that renders it, or leave the {role} messages out of the data",
                            row=rec.row, line=rec.line, field=rec.named(field))


def encode_conversation(rec: Record, field: str, tokenizer: PreTrainedTokenizerBase,
                        msgs: list[dict[str, str]]) -> tuple[list[int], list[int]]:
    """The rendered conversation's ids (`starting` with the tokenizer's leading tokens), and a
    mask that is 1 on each assistant turn."""
    text = render(rec, field, tokenizer, msgs, generation_prompt=False)
    _check_calls_rendered(rec, field, tokenizer, msgs, text)
    check_messages_rendered(rec, field, tokenizer, msgs, text)
    ids = encode(tokenizer, text)
    mask = [0] * len(ids)
    for i, msg in enumerate(msgs):
        if msg["role"] == "assistant":
            start = _prefix_length(rec, field, tokenizer, msgs[:i], True, text, ids)
            end = _prefix_length(rec, field, tokenizer, msgs[:i + 1], False, text, ids, strict=False)
            if end is None:  # the turn renders otherwise when last (Qwen3 drops earlier turns' thinking)
                span = _through_first_turn_end(rec, f"{field}[{i}]", tokenizer, ids[start:])
            else:
                span = _through_last_eos(rec, f"{field}[{i}]", tokenizer, ids[start:end])
            mask[start:start + len(span)] = [1] * len(span)
    started = starting(tokenizer, ids)
    return started, [0] * (len(started) - len(ids)) + mask


def _through_first_turn_end(rec: Record, field: str, tokenizer: PreTrainedTokenizerBase, rest: list[int]) -> list[int]:
    """From the turn's start through the first token sampling stops on, where the model writing
    this turn would have stopped: how a turn is found when rendering the conversation through it
    alone renders it otherwise than inside the whole conversation."""
    ends = turn_end_ids(tokenizer)
    first = next((i for i, token in enumerate(rest) if token in ends), None)
    return _through_last_eos(rec, field, tokenizer, rest[:first + 1] if first is not None else [])


def encode_reply(rec: Record, field: str, tokenizer: PreTrainedTokenizerBase, prompt: list[dict[str, str]],
                 answer: dict[str, str], count_prompt: bool = True) -> tuple[list[int], list[int]]:
    """(prompt ids ending with the generation prompt, `starting` with the tokenizer's leading
    tokens; reply ids through eos). `count_prompt=False`:
    the prompt's unknown tokens were counted already (a preference pair's second reply)."""
    text = render(rec, field, tokenizer, [*prompt, answer], generation_prompt=False)
    _check_calls_rendered(rec, field, tokenizer, [*prompt, answer], text)
    check_messages_rendered(rec, field, tokenizer, [*prompt, answer], text)
    ids = encode(tokenizer, text, count=count_prompt)
    start = _prefix_length(rec, field, tokenizer, prompt, True, text, ids)
    unknown = getattr(tokenizer, "_lmpo_unknown", None)
    if not count_prompt and unknown is not None:
        unknown.note(tokenizer, text, ids, skip=start)
    return starting(tokenizer, ids[:start]), _through_last_eos(rec, field, tokenizer, ids[start:])


def _prefix_mismatch(rec: Record, field: str, tokenizer, prefix: list[dict[str, str]], generation_prompt: bool,
                     text: str, full_text: str) -> str:
    """Why a rendered prefix is not the start of the whole conversation, with both texts where
    they part: the generation prompt (DeepSeek-R1's opens the turn with `<think>\n`, which the
    rendered turn lacks) or the earlier messages themselves."""
    at = next((i for i, (a, b) in enumerate(zip(text, full_text)) if a != b), min(len(text), len(full_text)))
    shown = f"alone {text[at:at + 30]!r}, in the conversation {full_text[at:at + 30]!r}"
    bare = render(rec, field, tokenizer, prefix, generation_prompt=False) if generation_prompt else text
    if generation_prompt and full_text.startswith(bare):
        opener = text[len(bare):]
        return (f"the chat template's generation prompt {opener!r} is not how it renders the conversation going "
                f"on after the first {len(prefix)} messages ({shown}), so the assistant tokens cannot be located: "
                f"a template that opens the model's turn with text its finished turns lack (DeepSeek-R1's "
                f"'<think>\\n') cannot be trained on as it is; give --chat_template FILE with a template whose "
                f"generation prompt is the start of a rendered turn")
    return (f"the tokenizer's chat template renders the first {len(prefix)} messages differently alone than inside "
            f"the whole conversation ({shown}), so the assistant tokens cannot be located; --chat_template FILE "
            f"gives another template")


def _prefix_length(rec: Record, field: str, tokenizer: PreTrainedTokenizerBase, prefix: list[dict[str, str]],
                   generation_prompt: bool, full_text: str, full_ids: list[int], strict: bool = True) -> int | None:
    """How many leading tokens of the whole conversation the rendered `prefix` accounts for
    (None, unless `strict`, when the rendered prefix is not one)."""
    text = render(rec, field, tokenizer, prefix, generation_prompt=generation_prompt)
    if not full_text.startswith(text):
        if not strict:
            return None
        raise DataError(rec.path, _prefix_mismatch(rec, field, tokenizer, prefix, generation_prompt, text, full_text),
                        row=rec.row, line=rec.line, field=rec.named(field))
    ids = encode(tokenizer, text, count=False)  # a prefix of the conversation, counted with it
    n = 0
    # Stops early only where a token merges across the boundary; that token then counts
    # as the later part's.
    while n < len(ids) and n < len(full_ids) and ids[n] == full_ids[n]:
        n += 1
    return n


def _through_last_eos(rec: Record, field: str, tokenizer: PreTrainedTokenizerBase, span: list[int]) -> list[int]:
    ends = turn_end_ids(tokenizer)
    last = max((i for i, token in enumerate(span) if token in ends), default=None)
    if last is None:
        names = ", ".join(repr(tokenizer.convert_ids_to_tokens(token)) for token in ends)
        raise DataError(rec.path, f"the chat template ends this assistant turn without a token sampling stops on "
                                  f"({names}: the tokenizer's eos and its generation config's), so a model trained "
                                  "on it would not learn to stop; set tokenizer.eos_token, or eos_token_id in "
                                  "generation_config.json, to the template's end-of-turn token",
                        row=rec.row, line=rec.line, field=rec.named(field))
    return span[:last + 1]


def turn_end_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The tokens sampling stops on (as `lmpo.rollout.engines.stop_token_ids`): the tokenizer's
    eos, then the other EOS ids of its model's generation config, which
    `lmpo.models.load_tokenizer` records on the tokenizer (Gemma's `<end_of_turn>`)."""
    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    return ids + [token for token in getattr(tokenizer, "_lmpo_stop_ids", ()) if token not in ids]

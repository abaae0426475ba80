"""Start-up warnings that a task's own demonstrations do not fit the run's token limits: every
episode like them would be cut off and not trained, which reads as a model that cannot learn.

`EpisodeRunner.for_task` checks each runner it builds, and an evaluation builds one each time it
runs; a warning is said once per task object (one per run), not before every evaluation."""

from __future__ import annotations

import warnings
import weakref

_said: dict[int, tuple[weakref.ref, set[str]]] = {}  # id(task) -> (the task, the warnings said for it)


def warn_once(task, message: str) -> None:
    """Warn `message` unless it was already said for this `task` object (a task that cannot be
    referenced weakly is warned about every time)."""
    key = id(task)
    entry = _said.get(key)
    if entry is None or entry[0]() is not task:
        try:
            ref = weakref.ref(task, lambda _, key=key: _said.pop(key, None))
        except TypeError:
            warnings.warn(message, stacklevel=4)
            return
        entry = _said[key] = (ref, set())
    if message not in entry[1]:
        entry[1].add(message)
        warnings.warn(message, stacklevel=4)


def warn_if_calls_overrun(task, tokenizer, limits) -> None:
    """Warn when the task's own demonstration calls (`task.demonstration_calls()`, where it has
    them) do not fit the turn cap under this tokenizer: every such call would end the episode as
    turn_length, which reads as a model that cannot call tools."""
    calls = getattr(task, "demonstration_calls", lambda: [])()
    if not calls or not limits.max_turn_tokens:
        return
    longest = max(len(tokenizer(call, add_special_tokens=False).input_ids) for call in calls)
    if longest + 1 > limits.max_turn_tokens:  # and its end-of-turn token
        warn_once(task, f"task {getattr(task, 'name', '')!r}: its demonstration tool calls take up to {longest} "
                        f"tokens and the end-of-turn token, more than the turn cap of {limits.max_turn_tokens} "
                        f"(--max_turn_tokens, or the task's own): such calls are cut off and end as turn_length; "
                        f"raise --max_turn_tokens to at least {longest + 1}")


def warn_if_demonstrations_overrun(task, renderer, tokenizer, limits, share: float = 0.85,
                                   budget_option: str = "--max_new_tokens") -> None:
    """Warn when the task's own demonstrations, rendered by this model's template, take more than
    `share` of the episode budget after the prompt: an episode a little longer than they are ends
    as token_budget and is not trained (QA: a ChatML template's tool wrapper took 46 of vault's 48
    tokens, and a quarter of the episodes were cut off). `budget_option`: the option that set
    `limits.max_tokens` (an evaluation's is `--eval_max_new_tokens`)."""
    from lmpo.rollout.render import ChatRenderer

    demonstrations = getattr(task, "sft_demonstrations", None)
    if limits.max_turns < 2 or not isinstance(renderer, ChatRenderer) or not callable(demonstrations):
        return
    try:
        used = []
        for conversation in demonstrations(16, 0):
            first = next(i for i, m in enumerate(conversation) if m["role"] == "assistant")
            prompt = renderer.render(conversation[:first], True)
            used.append(len(tokenizer(renderer.render(conversation, False), add_special_tokens=False).input_ids)
                        - len(tokenizer(prompt, add_special_tokens=False).input_ids))
    except Exception:  # demonstrations of another shape (a user's task): nothing to measure
        return
    if used and max(used) > share * limits.max_tokens:
        warn_once(task, f"task {getattr(task, 'name', '')!r}: its demonstrations take up to {max(used)} tokens "
                        f"after the prompt under this model's chat template, {max(used) / limits.max_tokens:.0%} of "
                        f"the episode budget of {limits.max_tokens} ({budget_option}, or the task's own): an episode "
                        f"a little longer ends as token_budget and is not trained; raise {budget_option} to about "
                        f"{int(max(used) * 1.5)}")

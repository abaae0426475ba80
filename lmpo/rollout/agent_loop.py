"""`run_episodes(engine, make_env, problems, ...) -> list[Trajectory]`: the one rollout loop.

Every live episode generates in one batch per turn; each environment then answers its model's
turn, and the observation is rendered and appended as a suffix (see `render`). A single-turn
task is the same loop with one turn. Every exit sets a termination reason.

Budgets: one token budget per trajectory (everything after the prompt: model, template and
environment tokens); each turn is capped at min(per-turn cap, what remains of the budget, what
remains of the model's context). Observations longer than `max_observation_chars` are clipped
with a visible marker (after any text that is not valid UTF-8 becomes U+FFFD); one that would
not fit the context (or the budget) is rolled back and the episode ends as `context_overflow`
(or `token_budget`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from lmpo.envs.base import Problem
from lmpo.envs.env import (ANSWERED, CONTEXT_OVERFLOW, ENV_DONE, ENV_ERROR, MAX_TURNS, PARSE_ERROR_LIMIT,
                           TERMINATIONS, TOKEN_BUDGET, TOOL_TIMEOUT, TURN_LENGTH, EnvFactory, Step, check_opening,
                           check_step, env_raised)
from lmpo.envs.user_calls import inside_unless_lmpo
from lmpo.rollout.budget_warnings import warn_if_calls_overrun, warn_if_demonstrations_overrun
from lmpo.rollout.engines import Engine
from lmpo.rollout.env_workers import EnvWorkers, env_timeout_of, env_workers_of
from lmpo.rollout.render import ChatRenderer, TemplateError, TextRenderer
from lmpo.rollout.trajectory import MODEL, PROMPT, Trajectory
from lmpo.rollout.types import FINISH_EOS, SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

CLIP_MARKER = "...[clipped {n} chars]"
MAX_OBSERVATION_CHARS = 512  # a task's `max_observation_chars` when it declares none
MAX_CRASHES_KEPT = 3  # tool crashes kept in a trajectory's info: enough to show, not one per turn
USER_ERRORS = (Exception, SystemExit)  # sys.exit() in an environment ended the run with exit code 0, in silence


@dataclass(frozen=True)
class EpisodeLimits:
    max_turns: int = 1
    """Model turns per episode; the episode ends as `max_turns` when the last one did not answer."""
    max_tokens: int = 64
    """Token budget of a trajectory after its prompt (model, template and observation tokens)."""
    max_turn_tokens: int = 0
    """Cap on one model turn (0: the budget)."""
    max_context: int = 0
    """The model's context length: prompt plus trajectory never exceed it (0: no limit)."""
    max_parse_errors: int = 3
    """Malformed turns (bad call syntax, unknown tool, bad arguments) before the episode ends as `parse_error_limit`."""
    max_observation_chars: int = MAX_OBSERVATION_CHARS
    """Longer observations are clipped, with a marker the model can see. This applies after a
    tool's own limit (the python tool's `max_output_chars`): the smaller of the two wins."""

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_tokens", "max_parse_errors", "max_observation_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_turn_tokens < 0 or self.max_context < 0:
            raise ValueError("max_turn_tokens and max_context must be >= 0 (0 = no separate limit)")


def _open(make_env: EnvFactory, problem: Problem, episode: int) -> tuple:
    """A new environment, reset on `problem`: (env, opening messages, None) or (env or None, None,
    what went wrong). A factory that raises (an environment whose `__init__` cannot open its
    database) ends the episode as a reset that raised does, not the run with lmpo's traceback."""
    try:
        with inside_unless_lmpo(make_env, lambda: f"{_name(make_env)}() of episode {episode}{_of(problem)}"):
            env = make_env()
    except USER_ERRORS as err:  # as in `step`: the episode ends as env_error, the batch goes on
        return None, None, env_raised(_name(make_env), err)
    if not (callable(getattr(env, "reset", None)) and callable(getattr(env, "step", None))):
        return None, None, (f"{_name(make_env)} returned {type(env).__name__}, not an environment (an object "
                            f"with reset(problem) and step(text)); a make_env without `return`?")
    try:
        with inside_unless_lmpo(make_env, lambda: f"{type(env).__name__}.reset of episode {episode}{_of(problem)}"):
            messages = env.reset(problem)
    except USER_ERRORS as err:
        return env, None, env_raised(f"{type(env).__name__}.reset", err)
    try:
        return env, check_opening(env, messages), None
    except ValueError as err:  # names the method and what it returned
        return env, None, str(err)


class Overran(str):
    """What went wrong, when it is that the environment's call overran the task's `env_timeout`:
    the episode ends as `tool_timeout`, not `env_error`."""


def _overran(what: str):
    return lambda timeout_s: (None, Overran(f"{what} did not return within the task's env_timeout of "
                                            f"{timeout_s:g} s (it was given up; its thread is left to it)"))


def _name(make_env: EnvFactory) -> str:
    """How the person who wrote the factory calls it: `MyTask.make_env`, `MyEnv` (a class)."""
    return getattr(make_env, "__qualname__", None) or type(make_env).__name__


def _of(problem: Problem) -> str:
    return f" (prompt {problem.prompt[:60]!r})"


def _step(env, text: str, episode: int, problem: Problem, make_env: EnvFactory) -> tuple[Step | None, str | None]:
    """The environment's answer to the model's turn: (step, None) or (None, what went wrong)."""
    try:
        with inside_unless_lmpo(make_env, lambda: f"{type(env).__name__}.step of episode {episode}{_of(problem)}"):
            step = env.step(text)
    except USER_ERRORS as err:  # an environment bug must not take the batch down; it is excluded from training
        return None, env_raised(f"{type(env).__name__}.step", err)
    try:
        return check_step(env, step), None
    except ValueError as err:  # names the method and what it returned
        return None, str(err)


class _Episode:
    def __init__(self, problem: Problem, opened: tuple, renderer, limits: EpisodeLimits, slot: int):
        self.env, opening, failed = opened
        self.renderer, self.limits, self.slot = renderer, limits, slot  # slot: which worker runs its env
        # the record of the conversation, shared
        self.messages = opening if failed is None else [{"role": "user", "content": problem.prompt}]
        ids, self.held_text = renderer.prompt(self.messages)
        self.pending_ids: list[int] = []
        if not ids:
            raise ValueError(f"problem {problem.prompt[:60]!r} renders to an empty prompt")
        self.traj = Trajectory(problem, len(ids), list(ids), [PROMPT] * len(ids), [0.0] * len(ids),
                               messages=self.messages)
        if failed:
            self.end(TOOL_TIMEOUT if isinstance(failed, Overran) else ENV_ERROR, error=failed)

    @property
    def used(self) -> int:
        return len(self.traj.token_ids) - self.traj.prompt_length

    def turn_cap(self) -> tuple[int, str]:
        """How many tokens the next turn may take, and the reason an episode stopped by it ends with."""
        limits = self.limits
        caps = [(limits.max_tokens - self.used, TOKEN_BUDGET)]
        if limits.max_turn_tokens:
            caps.append((limits.max_turn_tokens, TURN_LENGTH))
        if limits.max_context:
            caps.append((limits.max_context - len(self.traj.token_ids), CONTEXT_OVERFLOW))
        return min(caps, key=lambda c: c[0])

    def end(self, reason: str, **info) -> None:
        assert reason in TERMINATIONS, reason
        self.traj.termination = reason
        self.traj.info.update(info)


def run_episodes(engine: Engine, make_env: EnvFactory, problems: Sequence[Problem], params: SamplingParams,
                 limits: EpisodeLimits, renderer: TextRenderer | ChatRenderer, tokenizer: PreTrainedTokenizerBase,
                 env_workers: int = 1, env_timeout: float = 0.0) -> list[Trajectory]:
    """Run one episode per problem (repeat a problem G times for a group); trajectories in problem
    order. `env_workers`: environments created, reset and stepped at once, each episode's on one
    thread of its own (see `EnvWorkers`). `env_timeout`: seconds an environment's call may take
    before its episode ends as `tool_timeout` (0: no limit)."""
    with EnvWorkers(env_workers, env_timeout) as workers:
        return _run(engine, make_env, problems, params, limits, renderer, tokenizer, workers)


def _run(engine: Engine, make_env: EnvFactory, problems: Sequence[Problem], params: SamplingParams,
         limits: EpisodeLimits, renderer, tokenizer, workers: EnvWorkers) -> list[Trajectory]:
    eos_ids = set(getattr(engine, "eos_ids", None) or _eos_ids(tokenizer))  # the engine's stop tokens
    workers.on_timeout = lambda t: (None, None, _overran("the environment's make_env() and reset")(t)[1])
    opened = workers.run([(i, lambda i=i, p=p: _open(make_env, p, i)) for i, p in enumerate(problems)])
    episodes = [_Episode(p, o, renderer, limits, slot) for slot, (p, o) in enumerate(zip(problems, opened))]
    live = []
    for ep in episodes:
        cap, reason = ep.turn_cap()
        if ep.traj.termination:  # its environment did not start
            continue
        if cap > 0:
            live.append(ep)
        elif reason == CONTEXT_OVERFLOW:  # nothing can be sampled at all: said, and a run of only these stops
            ep.end(reason, error=f"the prompt alone takes {ep.traj.prompt_length} tokens, and the model's context "
                                 f"is {limits.max_context}")
        else:
            ep.end(reason)
    for turn in range(limits.max_turns):
        if not live:
            break
        caps = [ep.turn_cap() for ep in live]
        samples = engine.generate([ep.traj.token_ids for ep in live], params,
                                  max_new_tokens=[c for c, _ in caps])
        acting = [(ep, text) for ep, sample, (_, cap_reason) in zip(live, samples, caps)
                  if (text := _take_turn(ep, sample, cap_reason, eos_ids, tokenizer)) is not None]
        workers.on_timeout = _overran("the environment's step")
        answers = workers.run([(ep.slot, lambda ep=ep, text=text: _step(ep.env, text, ep.slot, ep.traj.problem,
                                                                         make_env)) for ep, text in acting])
        still = []
        for (ep, _), answer in zip(acting, answers):
            if _answer(ep, *answer, tokenizer, last=turn + 1 == limits.max_turns):
                cap, reason = ep.turn_cap()
                still.append(ep) if cap > 0 else ep.end(reason)
        live = still
    return [ep.traj for ep in episodes]


def _take_turn(ep: _Episode, sample, cap_reason: str, eos_ids: set[int], tokenizer) -> str | None:
    """Append the model's turn; its text for the environment to answer, or None when the turn
    ended the episode (no EOS: cut off by `cap_reason`)."""
    traj = ep.traj
    start = len(traj.token_ids)
    traj.token_ids += sample.token_ids
    traj.sources += [MODEL] * len(sample.token_ids)
    traj.logprobs += sample.logprobs
    traj.turn_spans.append((start, len(traj.token_ids)))
    ended = sample.finish_reason == FINISH_EOS and bool(sample.token_ids) and sample.token_ids[-1] in eos_ids
    traj.last_turn_eos = ended
    text_ids = sample.token_ids[:-1] if ended else sample.token_ids
    text = tokenizer.decode(text_ids, skip_special_tokens=False)  # for the environment's eyes only
    traj.final_text = text
    ep.pending_ids = sample.token_ids  # joins the held text only if an observation follows
    ep.messages.append({"role": "assistant", "content": text})
    if not ended:
        traj.turn_rewards.append(None)
        ep.end(cap_reason)
        return None
    return text


def _answer(ep: _Episode, step: Step | None, error: str | None, tokenizer, last: bool = False) -> bool:
    """Take in the environment's answer to the turn; True when the episode goes on. On the `last`
    turn the environment still carried the turn out (a write it makes counts), but its answer is
    not appended: no turn would read it."""
    traj = ep.traj
    if step is None:
        traj.turn_rewards.append(None)
        ep.end(TOOL_TIMEOUT if isinstance(error, Overran) else ENV_ERROR, error=error)
        return False
    traj.turn_rewards.append(step.reward)
    traj.tool_calls += int(step.info.get("tool_calls", 0))
    if step.info.get("parse_error"):
        traj.parse_errors += 1
    if step.info.get("tool_crashes"):  # the first few, for the trainer to report (the tool may be broken)
        crashes = traj.info.setdefault("tool_crashes", [])
        crashes.extend(step.info["tool_crashes"][:MAX_CRASHES_KEPT - len(crashes)])
    for name, n in step.info.get("counts", {}).items():  # an environment's own tallies, e.g. guardrail blocks
        traj.info.setdefault("counts", {})[name] = traj.info.get("counts", {}).get(name, 0) + n
    if step.done:
        if step.info.get("answer") is not None:  # what the environment read as the answer is what is graded
            traj.final_text = str(step.info["answer"])
        reason = step.info.get("termination") or (ANSWERED if "answer" in step.info else ENV_DONE)
        ep.end(reason, **{k: v for k, v in step.info.items() if k in ("error", "handoff", "verdict")})
        return False
    if traj.parse_errors >= ep.limits.max_parse_errors:
        ep.end(PARSE_ERROR_LIMIT)
        return False
    if last:
        ep.end(MAX_TURNS)
        return False
    ep.held_text += _turn_text(ep, tokenizer)
    return _append_observation(ep, step)


def _turn_text(ep: _Episode, tokenizer) -> str:
    """The model's turn as the template goes on from it. A turn the model ended with another of
    the engine's stop tokens than the one the template closes turns with (`<|endoftext|>` where it
    writes `<|im_end|>`) keeps its sampled ids; only the text the template continues from reads
    as the template's own ending."""
    held = tokenizer.decode(ep.pending_ids, skip_special_tokens=False)
    closing = getattr(ep.renderer, "turn_end", None)
    if closing and ep.traj.last_turn_eos and not held.endswith(closing):
        sampled = tokenizer.decode(ep.pending_ids[-1:], skip_special_tokens=False)
        if held.endswith(sampled):
            held = held[:len(held) - len(sampled)] + closing
    return held


def _append_observation(ep: _Episode, step: Step) -> bool:
    traj, limits = ep.traj, ep.limits
    new = []
    for message in step.messages():
        content = encodable(message.get("content") or "")
        cut = len(content) - limits.max_observation_chars
        if cut > len(CLIP_MARKER.format(n=cut)):  # a marker no shorter than the cut would only lengthen it
            content = content[:limits.max_observation_chars] + CLIP_MARKER.format(n=cut)
        new.append({**message, "content": content})
    try:
        ids, sources, _, conversation = ep.renderer.suffix(ep.held_text, ep.messages, new)
    except TemplateError as err:
        ep.end(ENV_ERROR, error=str(err))
        return False
    if limits.max_context and len(traj.token_ids) + len(ids) >= limits.max_context:
        ep.end(CONTEXT_OVERFLOW)  # rolled back: the observation is not appended
        return False
    if ep.used + len(ids) >= limits.max_tokens:
        ep.end(TOKEN_BUDGET)
        return False
    traj.token_ids += ids
    traj.sources += sources
    traj.logprobs += [0.0] * len(ids)
    ep.held_text = conversation  # the template's text, which may differ from the ids' (`Suffix.conversation`)
    ep.messages.extend(new)
    return True


def encodable(text: str) -> str:
    """`text` with each lone surrogate (what `os.listdir` or `surrogateescape` give for bytes that
    are not UTF-8) replaced by U+FFFD, as the sandbox decodes such bytes; a tokenizer refuses text
    that cannot be encoded as UTF-8, which would take the whole batch down."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:  # utf-16 joins a valid surrogate pair into its character
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _eos_ids(tokenizer) -> set[int]:
    eos = tokenizer.eos_token_id
    return set(eos) if isinstance(eos, (list, tuple)) else {eos}


def limits_for(task, model, max_tokens: int, *, max_turns: int = 0, max_turn_tokens: int = 0,
               max_parse_errors: int = 3) -> EpisodeLimits:
    """Episode limits from the run's options, falling back to the task's own (`task.max_turns`,
    `task.max_turn_tokens`, `task.max_observation_chars`) and the model's context length."""
    from lmpo.models.logprobs import context_length

    context = context_length(model) or 0
    observation_chars = getattr(task, "max_observation_chars", MAX_OBSERVATION_CHARS)
    if isinstance(observation_chars, bool) or not isinstance(observation_chars, int) or observation_chars < 1:
        raise ValueError(f"task {type(task).__name__}: max_observation_chars must be a positive integer (the "
                         f"characters of one observation the model sees), got {observation_chars!r}")
    return EpisodeLimits(max_turns=max_turns or int(getattr(task, "max_turns", 1)), max_tokens=max_tokens,
                         max_turn_tokens=max_turn_tokens or int(getattr(task, "max_turn_tokens", 0)),
                         max_context=context, max_parse_errors=max_parse_errors,
                         max_observation_chars=observation_chars)


@dataclass
class EpisodeRunner:
    """Everything needed to run a task's episodes with one engine: what RL, online DPO and
    evaluation share."""

    engine: Engine
    make_env: EnvFactory
    renderer: object
    limits: EpisodeLimits
    tokenizer: object
    params: SamplingParams
    env_workers: int = 1
    env_timeout: float = 0.0

    def run(self, problems: Sequence[Problem]) -> list[Trajectory]:
        return run_episodes(self.engine, self.make_env, problems, self.params, self.limits, self.renderer,
                            self.tokenizer, self.env_workers, self.env_timeout)

    @classmethod
    def for_task(cls, task, model, tokenizer, params: SamplingParams, *, generator=None, max_turns: int = 0,
                 max_turn_tokens: int = 0, max_parse_errors: int = 3, engine: Engine | None = None,
                 budget_option: str = "--max_new_tokens") -> "EpisodeRunner":
        """`engine` defaults to the built-in one on `model` (see `engine_select.make_engine` for vLLM).
        `budget_option`: the option that set `params.max_new_tokens`, for the warnings to name."""
        from lmpo.envs.env import env_factory
        from lmpo.rollout.engines import LocalEngine, stop_token_ids
        from lmpo.rollout.render import renderer_for

        if engine is None:
            engine = LocalEngine(model, stop_token_ids(model, tokenizer), tokenizer.pad_token_id, generator=generator)
        limits = limits_for(task, model, params.max_new_tokens, max_turns=max_turns, max_turn_tokens=max_turn_tokens,
                            max_parse_errors=max_parse_errors)
        warn_if_calls_overrun(task, tokenizer, limits)
        stops = _eos_first(getattr(engine, "eos_ids", None), tokenizer)
        renderer = renderer_for(task, tokenizer, stops)
        warn_if_demonstrations_overrun(task, renderer, tokenizer, limits, budget_option=budget_option)
        return cls(engine, env_factory(task), renderer, limits, tokenizer, params, env_workers_of(task),
                   env_timeout_of(task))


def check_rendering(task, model, tokenizer) -> None:
    """What `EpisodeRunner.for_task` checks of how the task's episodes render for this model (a chat
    template that is prefix-preserving, the tool format it teaches), for a stage that evaluates only
    after training (SFT, CPT): it refuses at start, not after the steps."""
    from lmpo.rollout.engines import stop_token_ids
    from lmpo.rollout.render import renderer_for

    renderer_for(task, tokenizer, _eos_first(stop_token_ids(model, tokenizer), tokenizer))


def _eos_first(stops, tokenizer) -> list[int] | None:
    """The tokenizer's EOS first (the prefix check's default), then the model's other stop tokens."""
    return [tokenizer.eos_token_id, *sorted(set(stops) - {tokenizer.eos_token_id})] if stops else None

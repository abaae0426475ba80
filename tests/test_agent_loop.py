"""The agent loop: termination reasons, malformed turns, budgets, token-in/token-out rendering,
masks and the zero gradient on observation tokens."""

from __future__ import annotations

import json
import re

import pytest
import torch

from lmpo.envs import Problem, make_task
from lmpo.envs.env import LENGTH_ENDINGS, TERMINATIONS, SingleTurnEnv, Step
from lmpo.envs.tool_env import ToolEnv
from lmpo.envs.tools import ToolError, ToolTimeout, tool
from lmpo.envs.parsing import CompactFormat
from lmpo.models import build_char_tokenizer, load_model_and_tokenizer
from lmpo.rollout import ENV, MODEL, PROMPT, EpisodeLimits, Sample, SamplingParams, run_episodes, to_rollout
from lmpo.rollout.render import ChatRenderer, TemplateError, TextRenderer, check_prefix_preserving


class ScriptedEngine:
    """Answers each episode's turns from a script chosen by the text of its first user turn."""

    def __init__(self, tokenizer, scripts: dict[str, list[str]], eos: bool = True):
        self.tok, self.scripts, self.eos = tokenizer, {k: list(v) for k, v in scripts.items()}, eos
        self.calls: list[list[int]] = []

    def sync_weights(self, model):
        pass

    def generate(self, prompts, params, max_new_tokens=None):
        out = []
        caps = max_new_tokens or [params.max_new_tokens] * len(prompts)
        for ids, cap in zip(prompts, caps):
            self.calls.append(list(ids))
            text = self.tok.decode(ids, skip_special_tokens=False)
            key = next(k for k in self.scripts if k in text)
            turn = self.scripts[key].pop(0)
            tokens = self.tok(turn, add_special_tokens=False).input_ids + ([self.tok.eos_token_id] if self.eos else [])
            reason = "eos" if self.eos else "length"
            if len(tokens) > cap:
                tokens, reason = tokens[:cap], "length"
            out.append(Sample(tokens, [-0.5] * len(tokens), reason))
        return out


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def _env_with(tools, opening="key"):
    return lambda: ToolEnv(lambda p: [{"role": "user", "content": p.prompt}], lambda p: tools, CompactFormat())


def _lookup():
    def lookup(key: str) -> str:
        """Look a key up.

        Args:
            key: the key.
        """
        if key == "slow":
            raise ToolTimeout("timeout: the lookup took longer than 1 s")
        if key == "big":
            return "7" * 300
        return {"1": "31415"}.get(key) or (_ for _ in ()).throw(ToolError(f"no key {key!r}"))
    return tool(lookup)


class _Raising(SingleTurnEnv):
    def step(self, action_text):
        raise RuntimeError("the environment broke")


class _NoStart(SingleTurnEnv):
    def reset(self, problem):
        raise RuntimeError("database not reachable")


class _Quits(SingleTurnEnv):
    def step(self, action_text):
        return Step(done=True, info={"handoff": True})


def _run(tok, scripts, limits, make_env=None, eos=True):
    problems = [Problem(prompt=name, answer="11345") for name in scripts]
    engine = ScriptedEngine(tok, scripts, eos=eos)
    renderer = ChatRenderer(tok)
    return run_episodes(engine, make_env or _env_with([_lookup()]), problems, SamplingParams(max_new_tokens=64),
                        limits, renderer, tok), engine


def test_every_termination_reason_is_reachable_and_recorded(tok):
    cases = {
        "answered": ({"qA": ["lookup(1)", "11345"]}, EpisodeLimits(max_turns=3, max_tokens=64), None, True),
        "env_done": ({"qB": ["bye"]}, EpisodeLimits(max_turns=3, max_tokens=64), _Quits, True),
        "max_turns": ({"qC": ["lookup(1)", "lookup(1)"]}, EpisodeLimits(max_turns=2, max_tokens=64), None, True),
        "token_budget": ({"qD": ["lookup(1)", "1134555555"]}, EpisodeLimits(max_turns=3, max_tokens=24), None, True),
        "turn_length": ({"qE": ["lookup(1)"]}, EpisodeLimits(max_turns=3, max_tokens=64, max_turn_tokens=5), None, True),
        "context_overflow": ({"qF": ["lookup(big)"]}, EpisodeLimits(max_turns=3, max_tokens=999, max_context=200), None, True),
        "parse_error_limit": ({"qG": ["lookup(1", "lookup(1)x"]}, EpisodeLimits(max_turns=5, max_tokens=99, max_parse_errors=2), None, True),
        "tool_timeout": ({"qH": ["lookup(slow)"]}, EpisodeLimits(max_turns=3, max_tokens=64), None, True),
        "env_error": ({"qI": ["anything"]}, EpisodeLimits(max_turns=3, max_tokens=64), _Raising, True),
    }
    assert set(cases) == set(TERMINATIONS)
    for reason, (script, limits, env, eos) in cases.items():
        (traj,), _ = _run(tok, script, limits, env, eos)
        assert traj.termination == reason, (reason, traj.termination, traj.segments(tok))
    (broken,), _ = _run(tok, {"qJ": ["x"]}, EpisodeLimits(max_turns=1, max_tokens=9), _Raising)
    assert "the environment broke" in broken.info["error"]


class _Submits(SingleTurnEnv):
    """The answer arrives as `submit(x)`: the environment reads `x` out of the turn."""

    def step(self, action_text):
        if action_text.startswith("submit(") and action_text.endswith(")"):
            return Step(done=True, info={"answer": action_text[len("submit("):-1]})
        return Step("error: call submit(answer)", info={"parse_error": True})


def test_what_the_environment_reads_as_the_answer_is_what_is_graded(tok):
    """The grader got the last turn's raw text, never the environment's `info["answer"]`:
    `submit(4)` was graded as "submit(4)", and a hermes answer "\n76" (the environment's "76")
    as "\n76", both wrong."""
    (traj,), _ = _run(tok, {"qS": ["oops", "submit(4)"]}, EpisodeLimits(max_turns=3, max_tokens=64), _Submits)
    assert traj.termination == "answered" and traj.final_text == "4"
    task = make_task("calculator:tool_format=hermes")
    env = task.make_env()
    env.reset(Problem(prompt="37*48 mod 100=?", answer="76"))
    (traj,), _ = _run(tok, {"qT": ["\n76"]}, EpisodeLimits(max_turns=3, max_tokens=64), lambda: env)
    assert traj.final_text == "76"
    assert task.grade(Problem(prompt="37*48 mod 100=?", answer="76"), traj.final_text, traj.terminated).correct


def test_only_episodes_cut_off_by_a_length_limit_count_as_truncated(tok):
    """Before: every trajectory whose last turn had no EOS was laid out as finish reason
    "length", so an environment whose reset raised (no token sampled) made `truncated_frac` 1.0
    and an overlong filter would mask it; now only a length ending is."""
    (failed,), _ = _run(tok, {"qI": ["x"]}, EpisodeLimits(max_turns=3, max_tokens=64), _NoStart)
    (cut,), _ = _run(tok, {"qE": ["lookup(1)"]}, EpisodeLimits(max_turns=3, max_tokens=64, max_turn_tokens=5))
    (answered,), _ = _run(tok, {"qA": ["lookup(1)", "11345"]}, EpisodeLimits(max_turns=3, max_tokens=64))
    assert (failed.termination, failed.num_model_tokens, cut.termination) == ("env_error", 0, "turn_length")
    rollout = to_rollout([failed, cut, answered], tok.pad_token_id)
    assert rollout.truncated.tolist() == [False, True, False]
    assert [t.truncated for t in (failed, cut, answered)] == [False, True, False]


def test_malformed_calls_and_tool_errors_continue_the_episode(tok):
    script = {"qA": ["lookup(1", "lookup(2)", "nosuch(1)", "lookup(1)", "11345"]}
    (traj,), _ = _run(tok, script, EpisodeLimits(max_turns=6, max_tokens=200, max_parse_errors=4))
    assert traj.termination == "answered"
    assert traj.parse_errors == 3 and traj.turns == 5
    assert traj.tool_calls == 2  # lookup(2) reached the tool and was refused; nosuch(1) reached none
    observations = [m["content"] for m in traj.messages if m["role"] == "tool"]
    assert observations[0].startswith("error: malformed tool call")
    assert "no key '2'" in observations[1] and "unknown tool 'nosuch'" in observations[2]
    assert observations[3] == "31415"
    assert traj.terminated and traj.final_text == "11345"


def test_sources_mask_and_rollout_layout(tok):
    (traj,), _ = _run(tok, {"qA": ["lookup(1)", "11345"]}, EpisodeLimits(max_turns=3, max_tokens=64))
    text = {src: "".join(s["text"] for s in traj.segments(tok) if s["source"] == src)
            for src in ("prompt", "model", "template", "env")}
    assert text == {"prompt": "<|user|>qA<|assistant|>", "model": "lookup(1)<eos>11345<eos>",
                    "template": "<|tool|><|assistant|>", "env": "31415"}
    mask = traj.loss_mask
    assert sum(mask) == traj.num_model_tokens == len("lookup(1)") + 1 + len("11345") + 1
    rollout = to_rollout([traj], tok.pad_token_id)
    assert int(rollout.lengths[0]) == traj.num_tokens - traj.prompt_length > sum(mask)  # tool output is not cut off
    assert rollout.loss_mask[0].tolist() == [float(m) for m in mask]
    assert all(lp == 0.0 for lp, s in zip(traj.logprobs, traj.sources) if s != MODEL)


def test_long_observations_are_clipped_with_a_marker(tok):
    (traj,), _ = _run(tok, {"qA": ["lookup(big)", "1"]}, EpisodeLimits(max_turns=3, max_tokens=999,
                                                                       max_observation_chars=50))
    observation = next(m["content"] for m in traj.messages if m["role"] == "tool")
    assert observation == "7" * 50 + "...[clipped 250 chars]"
    (traj,), _ = _run(tok, {"qA": ["lookup(big)", "1"]}, EpisodeLimits(max_turns=3, max_tokens=999,
                                                                       max_observation_chars=290))
    observation = next(m["content"] for m in traj.messages if m["role"] == "tool")
    assert observation == "7" * 300  # not 290 and a 22-character marker for 10 characters


def test_a_task_declares_its_own_observation_cap(tok):
    """Before: the cap was 512 characters whatever the task (limits_for never set it), so a tool
    whose own limit was larger (make_python_tool(max_output_chars=4000)) was cut at 512."""
    from lmpo.rollout.agent_loop import limits_for

    class Plain:
        max_turns = 3

    class Verbose(Plain):
        max_observation_chars = 4000

    assert limits_for(Plain(), None, 999).max_observation_chars == 512  # the embedded tasks' cap, unchanged
    limits = limits_for(Verbose(), None, 9999)
    assert limits.max_observation_chars == 4000

    def page(key: str) -> str:
        """A long page.

        Args:
            key: the key.
        """
        return "a" * 1500

    (traj,), _ = _run(tok, {"qA": ["page(1)", "1"]}, limits, _env_with([tool(page)]))
    assert [m["content"] for m in traj.messages if m["role"] == "tool"] == ["a" * 1500]
    for wrong in (0, -5, "4000", True):
        Verbose.max_observation_chars = wrong
        with pytest.raises(ValueError, match=f"^task Verbose: max_observation_chars must be a positive integer "
                                             rf"\(the characters of one observation the model sees\), got {wrong!r}$"):
            limits_for(Verbose(), None, 9999)


def test_an_observation_with_a_lone_surrogate_reaches_the_model_as_a_replacement_character(tok):
    """Before: a tool's output holding a lone surrogate (a file name from os.listdir that is not
    UTF-8) reached the tokenizer, whose TypeError took the whole batch down."""
    with pytest.raises(TypeError):  # what a fast tokenizer does with such text
        tok("file-\udcff.txt", add_special_tokens=False)

    def listing(key: str) -> str:
        """Files.

        Args:
            key: the key.
        """
        return {"1": "file-\udcff.txt", "2": "ok \ud83d\ude00"}[key]

    scripts = {"qA": ["listing(1)", "listing(2)", "1"], "qB": ["listing(2)", "1"]}
    trajs, _ = _run(tok, scripts, EpisodeLimits(max_turns=3, max_tokens=999), _env_with([tool(listing)]))
    assert [t.termination for t in trajs] == ["answered", "answered"]
    assert [m["content"] for m in trajs[0].messages if m["role"] == "tool"] == ["file-\ufffd.txt", "ok \U0001f600"]


def test_context_overflow_rolls_the_observation_back(tok):
    (traj,), _ = _run(tok, {"qF": ["lookup(big)"]}, EpisodeLimits(max_turns=3, max_tokens=999, max_context=200))
    assert traj.termination == "context_overflow"
    assert ENV not in traj.sources and traj.num_tokens < 200


def test_templates_that_are_not_prefix_preserving_are_refused(tok):
    check_prefix_preserving(ChatRenderer(tok), "<eos>")  # the embedded template is fine
    thinking = build_char_tokenizer()
    # drops reasoning blocks from every assistant turn but the last, as "thinking" templates do
    thinking.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|>"
        "{% if m['role'] == 'assistant' and not loop.last %}{{ m['content'].split('</think>')[-1] }}"
        "{% else %}{{ m['content'] }}{% endif %}{% if m['role'] == 'assistant' %}<eos>{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    with pytest.raises(TemplateError, match=r"not prefix-preserving: .* the agent loop holds '2 times 34\?<\|assistant"
                                            r"\|><think>I should compute ' where the template then renders '2 times "
                                            r"34\?<\|assistant\|>calculator\(12\*34\)<eos><\|'\. Once a later turn follows"):
        check_prefix_preserving(ChatRenderer(thinking), "<eos>")
    # QA: the message named only a character index, and always blamed rewritten earlier turns
    turn = "{% for m in messages %}<|{{ m['role'] }}|>{% if m['role'] == 'assistant' %}{{ REPLY }}<eos>{% else %}" \
           "{{ m['content'] }}{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|>PROMPT{% endif %}"
    for reply, prompt, cause in [("m['content']", "<think></think>", "The generation prompt differs from how the "
                                  "template renders the start of an assistant turn"),
                                 ("m['content'] | replace('<think>', '')", "", "The template rewrites the reply's own "
                                  "text")]:
        thinking.chat_template = turn.replace("REPLY", reply).replace("PROMPT", prompt)
        with pytest.raises(TemplateError, match=re.escape(cause)):
            check_prefix_preserving(ChatRenderer(thinking), "<eos>")


def test_single_turn_tasks_run_through_the_same_loop(tok):
    task = make_task("sort_digits")
    problems = task.heldout_problems(3)
    engine = ScriptedEngine(tok, {p.prompt: [p.answer] for p in problems})
    trajs = run_episodes(engine, SingleTurnEnv, problems, SamplingParams(max_new_tokens=12),
                         EpisodeLimits(max_turns=1, max_tokens=12), TextRenderer(tok), tok)
    assert [t.termination for t in trajs] == ["answered"] * 3
    assert [t.final_text for t in trajs] == [p.answer for p in problems]
    assert all(t.sources[:t.prompt_length] == [PROMPT] * t.prompt_length for t in trajs)
    assert all(task.grade(t.problem, t.final_text, t.terminated).correct for t in trajs)


def test_observation_and_template_tokens_get_exactly_zero_gradient(tmp_path):
    """Change the logits at observation and template positions: the loss and every gradient stay the same."""
    from lmpo.trainers.rl_batch import Batch
    from lmpo.trainers.rl_config import RLConfig
    from lmpo.trainers.rl_update import LossParts, micro_step

    model, tok = load_model_and_tokenizer("tiny", seed=0)
    scripts = {"key 1": ["lookup(1)", "11345"], "key 2": ["lookup(1)", "1345"]}
    problems = [Problem("key 1", "11345"), Problem("key 2", "11345")]
    trajs = run_episodes(ScriptedEngine(tok, scripts), _env_with([_lookup()]), problems,
                         SamplingParams(max_new_tokens=64), EpisodeLimits(max_turns=3, max_tokens=64),
                         ChatRenderer(tok), tok)
    from lmpo.models.padding import left_pad

    rollout = to_rollout(trajs, tok.pad_token_id)
    prompt_ids, prompt_mask = left_pad(rollout.prompt_ids, tok.pad_token_id)
    batch = Batch(prompt_ids, prompt_mask, rollout.completion_ids, rollout.loss_mask, rollout.logprobs,
                  advantages=torch.tensor([[1.0], [-1.0]]).expand_as(rollout.loss_mask).contiguous())
    real = torch.arange(rollout.completion_ids.size(1))[None] < rollout.lengths[:, None]
    not_model = real & (rollout.loss_mask == 0)
    assert int(not_model.sum()) == 2 * len("T31415A")  # <|tool|>, the observation and <|assistant|> in each row
    cfg = RLConfig(beta=0.0)
    parts = LossParts.from_config(cfg)
    counts = {"num_sequences": 2, "num_tokens": rollout.loss_mask.sum().item(), "max_len": 64}

    def grads(noise: float) -> tuple[float, list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        width = rollout.completion_ids.size(1)

        def perturb(module, args, output):
            delta = torch.randn(output.shape, generator=torch.Generator().manual_seed(1)) * noise
            keep = torch.zeros(output.shape[:2], dtype=torch.bool)
            keep[:, -(width + 1):-1] = not_model  # logits that predict observation/template tokens
            return output + delta * keep[..., None]

        handle = model.lm_head.register_forward_hook(perturb)
        try:
            share = micro_step(model, batch, cfg, parts, counts, 0.0)
        finally:
            handle.remove()
        return share["loss"], [p.grad.clone() for p in model.parameters() if p.grad is not None]

    loss0, g0 = grads(0.0)
    loss1, g1 = grads(5.0)
    assert loss0 == loss1
    assert all(torch.equal(a, b) for a, b in zip(g0, g1))
    assert any(a.abs().sum() > 0 for a in g0)


def test_the_unmasked_ablation_trains_observation_tokens_as_on_policy_actions():
    from lmpo.models import completion_logprobs
    from lmpo.models.padding import left_pad
    from lmpo.trainers.rl_batch import Batch, Scored
    from lmpo.trainers.rl import train_on_observations
    from lmpo.trainers.rl_config import RLConfig

    model, tok = load_model_and_tokenizer("tiny", seed=0)
    trajs = run_episodes(ScriptedEngine(tok, {"key 1": ["lookup(1)", "11345"]}), _env_with([_lookup()]),
                         [Problem("key 1", "11345")], SamplingParams(max_new_tokens=64),
                         EpisodeLimits(max_turns=3, max_tokens=64), ChatRenderer(tok), tok)
    rollout = to_rollout(trajs, tok.pad_token_id)
    ids, mask = left_pad(rollout.prompt_ids, tok.pad_token_id)
    batch = Batch(ids, mask, rollout.completion_ids, rollout.loss_mask.clone(), rollout.logprobs.clone())
    scored = Scored(rollout, [t.problem for t in trajs], torch.zeros(1), torch.ones(1), {}, [], 1, 0,
                    trajectories=trajs)
    train_on_observations(batch, scored, model, RLConfig())
    assert batch.loss_mask.sum() == int(rollout.lengths[0])  # every token after the prompt is trained
    own = completion_logprobs(model, ids, mask, rollout.completion_ids)[0]
    added = (batch.loss_mask - rollout.loss_mask).bool()
    assert torch.allclose(batch.old_logprobs[added], own[added])


def test_a_pipeline_that_cannot_train_a_multi_turn_task_stops_before_the_first_stage(tmp_path, capsys):
    from lmpo.cli.main import main

    assert main(["pipeline", "--task", "vault", "--rl", "online_dpo", "--out", str(tmp_path / "p")]) == 2
    assert "multi-turn: use an RL preset" in capsys.readouterr().err
    assert not (tmp_path / "p" / "cpt").exists()


def test_saved_training_episodes_say_what_the_loss_made_of_them(tmp_path, start_model):
    """trajectories.jsonl showed masked episodes like trained ones and recorded no action (QA F1):
    each training row now has the policy's action and its trained tokens, which add up to the step's."""
    from lmpo.cli.main import main

    run = tmp_path / "run"
    assert main(["train", "grpo", "--model", start_model, "--out", str(run), "--steps", "1",
                 "--prompts_per_step", "2", "--group_size", "2", "--max_new_tokens", "3", "--eval_problems", "0",
                 "--save_every", "0", "--threads", "1", "--reward_timeout", "0", "--save_trajectories", "4",
                 "--termination_policy", "length=mask"]) == 0
    saved = [json.loads(line) for line in open(run / "trajectories.jsonl")]
    step = next(r for r in map(json.loads, open(run / "metrics.jsonl")) if "trained_tokens" in r)
    assert any(r["termination_action"] == "mask" for r in saved)
    assert len(saved) == 4 and sum(r["trained_tokens"] for r in saved) == step["trained_tokens"]
    for r in saved:
        masked = r["termination"] in LENGTH_ENDINGS
        assert r["termination_action"] == ("mask" if masked else "train")
        assert (r["trained_tokens"] == 0) == masked

"""Chat templates and limits an agent run meets with a user's own model, checked at the token level.

Before:
- a template that silently drops `tool` messages passed the start-up check, so a tool's output
  never reached the model and nothing was said;
- a tool whose output is `user` or `tool_response` had the template's role marker labelled as
  the observation (`env`) and the observation as template (wrong `obs_token_frac` and colours);
- on the last allowed turn the tool's answer was still appended (28 tokens no turn reads),
  and an episode that ran out of budget there was recorded as `token_budget`, not `max_turns`;
- a prompt longer than the model's context made every episode empty, and the run exited 0."""

from __future__ import annotations

import pytest

from lmpo.envs import Problem
from lmpo.envs.parsing import CompactFormat
from lmpo.envs.tool_env import ToolEnv
from lmpo.envs.tools import tool
from lmpo.rollout import ENV, EpisodeLimits, SamplingParams, run_episodes
from lmpo.rollout.render import ChatRenderer, TemplateError, check_prefix_preserving
from lmpo.trainers.reward_watch import EnvFailure, WatchedRewards

from test_agent_hf import CHATML, bpe_tokenizer  # noqa: F401 (a fixture)
from test_agent_loop import ScriptedEngine


def test_a_template_that_drops_tool_messages_is_refused(bpe_tokenizer):
    tok = bpe_tokenizer
    check_prefix_preserving(ChatRenderer(tok), "<|im_end|>")
    dropping = CHATML.replace("{% if message['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n"
                              "{{ message['content'] }}\n</tool_response><|im_end|>\n",
                              "{% if message['role'] == 'tool' %}")
    assert dropping != CHATML
    tok.chat_template = dropping
    try:
        with pytest.raises(TemplateError, match=r"the chat template drops tool messages: .*\('408'\) does not appear"):
            check_prefix_preserving(ChatRenderer(tok), "<|im_end|>")
    finally:
        tok.chat_template = CHATML


@pytest.mark.parametrize("output", ["user", "tool_response", "1776"])
def test_an_observation_is_labelled_where_the_template_puts_it(bpe_tokenizer, output):
    tok = bpe_tokenizer
    renderer = ChatRenderer(tok)
    messages = [{"role": "user", "content": "who am I?"}]
    _, held = renderer.prompt(messages)
    messages.append({"role": "assistant", "content": "lookup(a)"})
    ids, sources, text, _ = renderer.suffix(held + "lookup(a)<|im_end|>", messages, [{"role": "tool", "content": output}])
    env_text = "".join(tok.decode([i]) for i, s in zip(ids, sources) if s == ENV)
    assert env_text == output
    first = sources.index(ENV)
    assert tok.decode(ids[:first]).endswith("<tool_response>\n")  # the content, not the marker, is the env's


@tool
def lookup(key: str) -> str:
    """Look a key up.

    Args:
        key: the key.
    """
    return "31415" * 3


def _run(tok, scripts, limits):
    env = lambda: ToolEnv(lambda p: [{"role": "user", "content": p.prompt}], lambda p: [lookup], CompactFormat())
    return run_episodes(ScriptedEngine(tok, scripts), env, [Problem(prompt=k, answer="1") for k in scripts],
                        SamplingParams(max_new_tokens=64), limits, ChatRenderer(tok), tok)


def test_the_last_allowed_turn_gets_no_observation_and_ends_as_max_turns(bpe_tokenizer):
    tok = bpe_tokenizer
    (traj,) = _run(tok, {"key a": ["lookup(a)", "lookup(a)"]}, EpisodeLimits(max_turns=2, max_tokens=400))
    assert traj.termination == "max_turns" and traj.tool_calls == 2
    assert traj.sources[-1] == 1  # the episode ends on the model's own last token (its EOS), not an observation
    assert sum(s == ENV for s in traj.sources) == len(tok("31415" * 3, add_special_tokens=False).input_ids)
    # a budget that holds both turns but not the second observation: still max_turns
    used = len(traj.token_ids) - traj.prompt_length
    (tight,) = _run(tok, {"key a": ["lookup(a)", "lookup(a)"]}, EpisodeLimits(max_turns=2, max_tokens=used + 1))
    assert tight.termination == "max_turns"


def test_a_prompt_that_fills_the_context_is_said_and_a_run_of_only_such_stops(bpe_tokenizer, tmp_path, capsys):
    tok = bpe_tokenizer
    trajectories = _run(tok, {"key a": ["x"], "key b": ["x"]}, EpisodeLimits(max_turns=2, max_tokens=99, max_context=5))
    assert [t.termination for t in trajectories] == ["context_overflow"] * 2
    assert trajectories[0].num_model_tokens == 0
    assert trajectories[0].info["error"].startswith("the prompt alone takes ")
    assert trajectories[0].info["error"].endswith("tokens, and the model's context is 5")

    class Runner:
        def close(self):
            pass

    watched = WatchedRewards(Runner(), tmp_path, max_unscorable_steps=2, memory_mb=0)
    watched.note_episodes(trajectories)
    assert "[env] 2 of 2 episodes ended in context_overflow: the prompt alone takes" in capsys.readouterr().err
    with pytest.raises(EnvFailure, match="the model's context is 5"):
        watched.note_episodes(trajectories)

    class OtherProcessFine:  # torchrun: the other process's episodes ran; the stop is the run's, not one process's
        active, world = True, 2

        def all_true(self, flag: bool) -> bool:
            return False

    watched = WatchedRewards(Runner(), tmp_path, max_unscorable_steps=2, memory_mb=0, ctx=OtherProcessFine())
    for _ in range(3):  # was: this process alone stopped the run (and, at its end, raised EnvFailure)
        watched.note_episodes(trajectories)
    watched.close()


def test_lmpos_tool_tasks_speak_hermes_when_asked_and_say_when_the_template_teaches_it(bpe_tokenizer):
    """Before, `calculator` and `vault` always read compact calls: a model answering as a Qwen-style
    template teaches (`<tool_call>{json}</tool_call>`) had its call graded as the final answer, with
    no tool call, no parse error and nothing said."""
    from lmpo.envs import make_task
    from lmpo.envs.parsing import CompactFormat
    from lmpo.rollout.render import renderer_for

    for spec, tool_name in (("calculator:tool_format=hermes", "calculator"), ("vault:tool_format=hermes", "lookup")):
        task = make_task(spec)
        demo = task.sft_demonstrations(1, 0)[0]
        call = next(m["content"] for m in demo if m["role"] == "assistant")
        assert call.startswith("<tool_call>") and f'"name": "{tool_name}"' in call
        env = task.make_env()
        env.reset(task.train_problems(1, 0)[0])
        assert env.step(call).info == {"tool_calls": 1, "parse_error": False}
    assert make_task("calculator").sft_demonstrations(1, 0)[0][1]["content"].startswith("calculator(")
    with pytest.raises(ValueError, match="task option tool_format: unknown tool-call format 'xml'; known: compact"):
        make_task("vault:tool_format=xml")
    turn = CompactFormat().parse('<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call>')
    assert turn.answer is None and "a <tool_call> block, but this environment reads calls written as" in turn.error
    tok = bpe_tokenizer
    tok.chat_template = CHATML + "{# tools go in <tool_call> blocks #}"
    try:
        with pytest.warns(UserWarning, match="pass tool_format=hermes"):
            renderer_for(make_task("calculator"), tok)
        # QA: the suggestion named the display name, `--task vault(length=5):tool_format=hermes`, which does not parse
        with pytest.warns(UserWarning, match=r"\(--task vault:length=4,tool_format=hermes\)"):
            renderer_for(make_task("vault:length=4"), tok)
        with pytest.warns(UserWarning, match=r"\(--task vault:tool_format=hermes\)"):
            renderer_for(make_task("vault"), tok)
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            renderer_for(make_task("calculator:tool_format=hermes"), tok)
    finally:
        tok.chat_template = CHATML


def test_the_stop_token_the_template_closes_turns_with_is_found_among_the_engines(bpe_tokenizer):
    """A model whose tokenizer EOS is `<|endoftext|>` while its ChatML template closes turns with
    `<|im_end|>` (both stop tokens in its generation config, as Qwen2.5 base or Gemma-style
    models have) was refused as 'not prefix-preserving, e.g. removing reasoning blocks'; with only
    `<|endoftext|>` as a stop token the refusal now names the real cause."""
    tok = bpe_tokenizer
    renderer = ChatRenderer(tok)
    check_prefix_preserving(renderer, ["<|endoftext|>", "<|im_end|>"])
    assert renderer.turn_end == "<|im_end|>"
    with pytest.raises(TemplateError, match=r"ends an assistant turn with '<\|im_end\|>\\n', which is not the text of "
                                            r"a token generation stops at \('<\|endoftext\|>'\)"):
        check_prefix_preserving(ChatRenderer(tok), ["<|endoftext|>"])


def test_a_turn_ended_by_another_stop_token_goes_on_as_the_templates_turn(bpe_tokenizer):
    """Qwen2.5-Instruct stops on `<|im_end|>` and `<|endoftext|>`: a tool call the model closed with
    `<|endoftext|>` ended the episode as env_error ('rendered the conversation so far differently')."""
    from lmpo.rollout import Sample

    tok = bpe_tokenizer
    other = tok.convert_tokens_to_ids("<|endoftext|>")
    turns = [tok("lookup(a)", add_special_tokens=False).input_ids + [other],
             tok("1", add_special_tokens=False).input_ids + [tok.eos_token_id]]
    sampled = [list(t) for t in turns]

    class Replay:
        eos_ids = {tok.eos_token_id, other}

        def generate(self, prompts, params, max_new_tokens=None):
            ids = turns.pop(0)
            return [Sample(ids, [-1.0] * len(ids), "eos")]

    renderer = ChatRenderer(tok)
    check_prefix_preserving(renderer, ["<|im_end|>", "<|endoftext|>"])
    env = lambda: ToolEnv(lambda p: [{"role": "user", "content": p.prompt}], lambda p: [lookup], CompactFormat())
    (traj,) = run_episodes(Replay(), env, [Problem(prompt="key a", answer="1")], SamplingParams(max_new_tokens=40),
                           EpisodeLimits(max_turns=3, max_tokens=200), renderer, tok)
    assert traj.termination == "answered" and traj.tool_calls == 1
    assert [traj.token_ids[s:e] for s, e in traj.turn_spans] == sampled  # the sampled ids kept as they were


def test_a_template_that_trims_the_models_turn_goes_on_from_the_sampled_ids(bpe_tokenizer):
    """Llama 3's template renders `message['content'] | trim`: a turn the model ended with a space
    (or began with one) ended the episode as env_error, so such episodes were left out of training
    and of the baseline, a silent selection. The sampled ids stay as they are, and the
    conversation goes on from the template's text of the turn, turn after turn."""
    tok = bpe_tokenizer
    tok.chat_template = CHATML.replace("{{ message['content'] }}<|im_end|>", "{{ message['content'] | trim }}<|im_end|>")
    assert tok.chat_template != CHATML
    try:
        renderer = ChatRenderer(tok)
        check_prefix_preserving(renderer, "<|im_end|>")
        scripts = {"key a": ["lookup(a) ", " lookup(a)\n", "1 "]}
        env = lambda: ToolEnv(lambda p: [{"role": "user", "content": p.prompt}], lambda p: [lookup], CompactFormat())
        engine = ScriptedEngine(tok, scripts)
        (traj,) = run_episodes(engine, env, [Problem(prompt="key a", answer="1")], SamplingParams(max_new_tokens=40),
                               EpisodeLimits(max_turns=3, max_tokens=300), renderer, tok)
        assert traj.termination == "answered" and traj.tool_calls == 2, traj.info
        spans = [tok.decode(traj.token_ids[s:e]) for s, e in traj.turn_spans]
        assert spans == ["lookup(a) <|im_end|>", " lookup(a)\n<|im_end|>", "1 <|im_end|>"]  # as sampled
        # each generation started from exactly the ids held so far: no re-encoding of earlier turns
        assert engine.calls[1] == traj.token_ids[:len(engine.calls[1])]
        assert engine.calls[2] == traj.token_ids[:len(engine.calls[2])]
    finally:
        tok.chat_template = CHATML


def test_sft_and_cpt_render_a_tool_task_with_the_tools_its_rl_and_eval_prompts_show(bpe_tokenizer):
    """SFT demonstrations and CPT documents of a tool task were rendered without the tool schemas
    a Qwen-style template writes into the system turn; the RL and eval prompts with them. The SFT
    model then met a prompt at eval it had never seen (800 characters more before the question)."""
    from lmpo.envs import make_task
    from lmpo.rollout.render import renderer_for
    from lmpo.trainers.batches import task_documents, task_examples

    tok = bpe_tokenizer
    tok.chat_template = ("{% if tools %}<|im_start|>system\nTools:{% for t in tools %} {{ t['function']['name'] }}"
                         "{% endfor %}<|im_end|>\n{% endif %}" + CHATML)
    try:
        task = make_task("calculator:tool_format=hermes")
        demo = task.sft_demonstrations(1, 0)[0]
        _, prompt = renderer_for(task, tok, [tok.convert_tokens_to_ids("<|im_end|>")]).prompt(demo[:1])
        assert prompt.startswith("<|im_start|>system\nTools: calculator<|im_end|>\n<|im_start|>user\n")
        sft = tok.decode(task_examples(tok, [demo], task)[0].input_ids, skip_special_tokens=False)
        assert sft.startswith(prompt), (sft[:80], prompt[:80])
        assert task_documents(task, tok, 1, 0)[0].startswith("<|im_start|>system\nTools: calculator<|im_end|>\n")
    finally:
        tok.chat_template = CHATML


@pytest.mark.parametrize("scheme", ["first", "always"])
def test_a_sentencepiece_suffix_is_encoded_as_the_whole_conversation_encodes_it(scheme):
    """With `Metaspace(prepend_scheme="first")` (Mistral, Llama with legacy=False) the suffix
    encoded alone began with `▁\\n` where the whole conversation has `\\n` after `<|im_end|>`: each
    turn put a token in the model's context that the template never writes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from lmpo.rollout import TEMPLATE

    core = Tokenizer(models.BPE(unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme)
    core.decoder = decoders.Metaspace(replacement="▁", prepend_scheme=scheme)
    core.train_from_iterator(["get abc fetch(abc) 42 user assistant tool \n hello"] * 50, trainers.BpeTrainer(
        vocab_size=200, special_tokens=["<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]))
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  unk_token="<unk>", additional_special_tokens=["<|im_start|>"])
    tok.chat_template = CHATML
    renderer = ChatRenderer(tok)
    talk = [{"role": "user", "content": "get abc"}, {"role": "assistant", "content": "fetch(abc)"}]
    held = renderer.render(talk[:1], True) + "fetch(abc)<|im_end|>"
    answer = [{"role": "tool", "content": "hello 42"}]
    suffix = renderer.suffix(held, talk, answer)
    whole = tok(renderer.render([*talk, *answer], True), add_special_tokens=False).input_ids
    assert whole[-len(suffix.ids):] == suffix.ids, tok.convert_ids_to_tokens(suffix.ids)
    labelled = [tok.convert_ids_to_tokens(i) for i, s in zip(suffix.ids, suffix.sources) if s != TEMPLATE]
    assert "".join(labelled).replace("▁", " ").strip() == "hello 42"


def test_a_template_that_writes_a_space_before_its_end_of_turn_token_is_told_to_remove_it(tmp_path):
    """QA: `{{ content }} <eos>` was refused with 'name the template's end-of-turn token as a stop
    token', which it already is: the space before it is what no sampled turn ever has."""
    from lmpo.envs import make_task
    from lmpo.models.loading import load_tokenizer
    from lmpo.models.tokenizer import CHAT_TEMPLATE
    from lmpo.rollout.render import renderer_for

    template = tmp_path / "spaced.jinja"
    template.write_text(CHAT_TEMPLATE.replace("%}<eos>{%", "%} <eos>{%"))
    tok = load_tokenizer("tiny", chat_template=str(template))
    with pytest.raises(TemplateError) as refused:
        renderer_for(make_task("calculator"), tok)
    assert str(refused.value) == (
        f"the chat template ({template}, given by --chat_template) writes ' ' between an assistant turn's text and "
        "'<eos>', so a turn the model ends with '<eos>' never matches the template's text of it; remove the ' ' "
        "before '<eos>' from the template")

import pytest
import torch

from lmpo.models import completion_logprobs
from lmpo.rollout import FINISH_EOS, FINISH_LENGTH, SamplingParams, decoders, generate, left_pad


def _prompts(tok):
    # repeated prompts, as in a GRPO group: prefilled once, their caches copied
    return [tok(s, add_special_tokens=False).input_ids for s in ["31415=", "9=", "1234567=", "9=", "ab", "31415="]]


def _teacher_forced(model, rollout, temperature, pad_id):
    prompt_ids, prompt_mask = left_pad(rollout.prompt_ids, pad_id)
    with torch.no_grad():
        logprobs, _ = completion_logprobs(model, prompt_ids, prompt_mask, rollout.completion_ids, temperature)
    return logprobs * rollout.loss_mask


def _full_forward_logprobs(model, rollout, temperature):
    """Independent reference: one unpadded forward per sequence, full logits."""
    rows = []
    for prompt, completion in zip(rollout.prompt_ids, rollout.completion_token_lists()):
        ids = torch.tensor([prompt + completion])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0].double() / temperature, dim=-1)
        rows.append([logp[len(prompt) - 1 + j, tok].item() for j, tok in enumerate(completion)])
    return rows


@pytest.mark.parametrize("backend", ["fast", "fast-prepacked", "hf"])
@pytest.mark.parametrize("model_name", ["tiny_llama", "tiny_qwen2"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_rollout_logprobs_match_a_teacher_forced_forward(backend, model_name, temperature, char_tokenizer, request,
                                                         monkeypatch):
    # the fast decoder prepacks its weights only for long enough decodes of large enough models
    # (not these): "fast-prepacked" takes that path here
    monkeypatch.setattr(decoders, "PACK_FROM_WORK", 0 if backend == "fast-prepacked" else decoders.PACK_FROM_WORK)
    backend = backend.removesuffix("-prepacked")
    model = request.getfixturevalue(model_name)
    tok = char_tokenizer
    gen = torch.Generator().manual_seed(0)
    rollout = generate(model, _prompts(tok), SamplingParams(temperature=temperature, max_new_tokens=10),
                       eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, generator=gen, backend=backend)
    reference = _full_forward_logprobs(model, rollout, temperature)
    for row, ref in enumerate(reference):
        got = rollout.logprobs[row, : len(ref)]
        assert torch.allclose(got.double(), torch.tensor(ref, dtype=torch.float64), atol=1e-4)
    assert torch.allclose(_teacher_forced(model, rollout, temperature, tok.pad_token_id), rollout.logprobs, atol=1e-4)
    assert rollout.logprobs.dtype == torch.float32


def test_fast_and_generic_backends_sample_the_same_tokens(tiny_qwen2, char_tokenizer):
    tok = char_tokenizer
    runs = [generate(tiny_qwen2, _prompts(tok), SamplingParams(max_new_tokens=8), eos_id=tok.eos_token_id,
                     pad_id=tok.pad_token_id, generator=torch.Generator().manual_seed(5), backend=b)
            for b in ("fast", "hf")]
    assert torch.equal(runs[0].completion_ids, runs[1].completion_ids)


def test_greedy_matches_transformers_generate(tiny_llama, char_tokenizer):
    tok = char_tokenizer
    prompt = tok("31415=", add_special_tokens=False).input_ids
    ours = generate(tiny_llama, [prompt], SamplingParams(temperature=0, max_new_tokens=12),
                    eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    ids = torch.tensor([prompt])
    theirs = tiny_llama.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=12,
                                 pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)[0, len(prompt):]
    assert ours.completion_token_lists()[0] == theirs.tolist()[: len(ours.completion_token_lists()[0])]


def test_eos_ends_a_sequence_and_padding_carries_no_loss(tiny_llama, char_tokenizer):
    tok = char_tokenizer
    stop_ids = list(range(10, 30))  # treat 20 ids as end-of-sequence so both endings occur
    prompts = _prompts(tok) * 4
    rollout = generate(tiny_llama, prompts, SamplingParams(temperature=1.0, max_new_tokens=3), eos_id=stop_ids,
                       pad_id=tok.pad_token_id, generator=torch.Generator().manual_seed(3))
    assert set(rollout.finish_reasons) == {FINISH_EOS, FINISH_LENGTH}
    for row, reason in enumerate(rollout.finish_reasons):
        tokens = rollout.completion_token_lists()[row]
        if reason == FINISH_EOS:
            assert tokens[-1] in stop_ids and not set(tokens[:-1]) & set(stop_ids)
        else:
            assert len(tokens) == 3 and not set(tokens) & set(stop_ids)
        n = int(rollout.lengths[row])
        assert n == len(tokens)
        assert rollout.loss_mask[row, :n].eq(1).all() and rollout.loss_mask[row, n:].eq(0).all()
        assert rollout.logprobs[row, n:].eq(0).all() and rollout.completion_ids[row, n:].eq(tok.pad_token_id).all()


def test_all_sequences_stopping_early_ends_the_loop(char_tokenizer, tiny_llama):
    tok = char_tokenizer
    params = SamplingParams(temperature=1.0, top_k=1, max_new_tokens=30)
    a = generate(tiny_llama, _prompts(tok), params, eos_id=list(range(len(tok))), pad_id=tok.pad_token_id)
    assert a.completion_ids.shape[1] == 1 and all(r == FINISH_EOS for r in a.finish_reasons)


def test_top_k_one_is_greedy_and_seeds_reproduce(tiny_llama, char_tokenizer):
    tok = char_tokenizer
    greedy = generate(tiny_llama, _prompts(tok), SamplingParams(temperature=0, max_new_tokens=8),
                      eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    top1 = generate(tiny_llama, _prompts(tok), SamplingParams(temperature=1.3, top_k=1, max_new_tokens=8),
                    eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, generator=torch.Generator().manual_seed(1))
    assert torch.equal(greedy.completion_ids, top1.completion_ids)
    s1, s2 = (generate(tiny_llama, _prompts(tok), SamplingParams(top_p=0.9, max_new_tokens=8), eos_id=tok.eos_token_id,
                       pad_id=tok.pad_token_id, generator=torch.Generator().manual_seed(7)) for _ in range(2))
    assert torch.equal(s1.completion_ids, s2.completion_ids)


def test_top_p_never_draws_outside_the_nucleus():
    from lmpo.rollout.sampling import sample_next

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(2000, 1)
    tokens, _ = sample_next(logits, SamplingParams(top_p=0.75), torch.Generator().manual_seed(0))
    assert set(tokens.tolist()) == {0, 1}  # 0.5 + 0.3 covers 0.75; tokens 2 and 3 are cut


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=0), dict(top_k=-1), dict(max_new_tokens=0)])
def test_bad_sampling_params_are_rejected(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)


def _llama(char_tokenizer, **flags):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(char_tokenizer), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         pad_token_id=char_tokenizer.pad_token_id, eos_token_id=char_tokenizer.eos_token_id, **flags)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # transformers initialises biases to zero, which would hide a dropped bias
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_(0, 0.5)
    return model


@pytest.mark.parametrize("flags,fast", [
    ({}, True),
    ({"attention_bias": True}, True),                                   # q/k/v and o_proj biases: implemented
    ({"mlp_bias": True}, False),                                        # MLP biases: not implemented, falls back
    ({"hidden_act": "gelu"}, False),
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}}, False),
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}, True),
], ids=["plain", "attention_bias", "mlp_bias", "gelu", "dynamic_rope", "linear_rope"])
def test_the_fast_path_takes_only_configurations_it_implements_exactly(flags, fast, char_tokenizer):
    from lmpo.rollout.decoders import fast_path_refusal

    model = _llama(char_tokenizer, **flags)
    assert (fast_path_refusal(model) == "") == fast, fast_path_refusal(model)
    tok = char_tokenizer
    rollout = generate(model, _prompts(tok), SamplingParams(temperature=1.0, max_new_tokens=10),
                       eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, generator=torch.Generator().manual_seed(0))
    # behaviour log-probs equal a teacher-forced forward, whichever path sampled them
    assert torch.allclose(_teacher_forced(model, rollout, 1.0, tok.pad_token_id), rollout.logprobs, atol=1e-4)
    if not fast:
        with pytest.raises(ValueError, match="does not implement this LlamaForCausalLM exactly"):
            generate(model, _prompts(tok), SamplingParams(max_new_tokens=2), eos_id=tok.eos_token_id,
                     pad_id=tok.pad_token_id, backend="fast")


def test_a_chat_models_own_end_of_turn_token_ends_its_completion(tiny_llama, char_tokenizer):
    """A token the generation config lists as EOS (Gemma's <end_of_turn>, Llama 3's <|eot_id|>)
    ends a completion, as in transformers' generate: stopping on the tokenizer's EOS alone ran
    such a model to max_new_tokens, unterminated."""
    import copy

    from lmpo.envs import make_task
    from lmpo.rollout.agent_loop import EpisodeRunner
    from lmpo.rollout.engines import stop_token_ids

    tok, task = char_tokenizer, make_task("sort_digits")
    problem = task.make("31415")
    params = SamplingParams(max_new_tokens=12)

    def run(model):  # the same random numbers each time: the same tokens until a stop
        return EpisodeRunner.for_task(task, model, tok, params, generator=torch.Generator().manual_seed(3)).run(
            [problem])[0]

    plain = run(tiny_llama)
    written = plain.token_ids[plain.prompt_length:]
    # the first token it writes that it had not written before, after the first: it ends a turn now
    at = next(i for i in range(1, len(written)) if written[i] not in written[:i] + [tok.eos_token_id])
    model = copy.deepcopy(tiny_llama)
    model.generation_config.eos_token_id = [tok.eos_token_id, written[at]]
    assert stop_token_ids(model, tok) == [tok.eos_token_id, written[at]]
    ended = run(model)
    assert ended.token_ids[ended.prompt_length:] == written[:at + 1] and ended.last_turn_eos


def test_completion_logprobs_refuses_malformed_inputs(tiny_llama, char_tokenizer):
    # these used to fail 8 to 32 frames deep inside transformers (or at an IndexError in lmpo)
    ids = torch.tensor([char_tokenizer("31415=", add_special_tokens=False).input_ids])
    mask, completion = torch.ones_like(ids), torch.tensor([char_tokenizer("11345", add_special_tokens=False).input_ids])
    cases = [((ids, mask[:, :3], completion), r"prompt_mask shape \(1, 3\) != prompt_ids shape \(1, 6\)"),
             ((ids.float(), mask, completion), r"prompt_ids must be 2-D integer token ids .* torch.float32"),
             ((ids[0], mask[0], completion[0]), r"prompt_ids must be 2-D integer token ids \[B, length\], got shape \(6,\)"),
             ((ids, mask, completion.repeat(2, 1)), r"completion_ids has 2 rows, prompt_ids 1")]
    for args, message in cases:
        with pytest.raises(ValueError, match=message):
            completion_logprobs(tiny_llama, *args)


def test_generate_refuses_bad_backend_ids_and_context_overflow(tiny_llama, char_tokenizer):
    tok, params = char_tokenizer, SamplingParams(max_new_tokens=4)
    ids = tok("31415=", add_special_tokens=False).input_ids
    options = {"eos_id": tok.eos_token_id, "pad_id": tok.pad_token_id}
    with pytest.raises(ValueError, match=r"backend must be one of auto, fast, hf, got 'fastt'"):
        generate(tiny_llama, [ids], params, backend="fastt", **options)  # used to run as "auto"
    vocab = tiny_llama.get_input_embeddings().num_embeddings
    with pytest.raises(ValueError, match=rf"prompt token ids must be in \[0, {vocab}\) .* got ids from \d+ to 99999"):
        generate(tiny_llama, [ids, [99999]], params, **options)  # used to be an IndexError in the embedding
    context = tiny_llama.config.max_position_embeddings
    long = [ids[0]] * (context - 2)
    with pytest.raises(ValueError, match=rf"prompt 1 has {context - 2} tokens and may get 4 new ones .* context of {context}"):
        generate(tiny_llama, [ids, long], params, **options)  # used to sample past the context silently
    # a caller that keeps fewer new tokens of a row (LocalEngine cuts each row at its cap) may go there
    rollout = generate(tiny_llama, [ids, long], params, caps=[4, 2], **options)
    assert rollout.completion_ids.shape[0] == 2


def test_local_engine_checks_each_row_against_its_own_cap(tiny_llama, char_tokenizer):
    # the agent loop caps a turn at what is left of the context: a long row with a small cap beside
    # a short row with a large one fits, though the batch is sampled for the larger cap
    from lmpo.rollout import LocalEngine

    tok = char_tokenizer
    engine = LocalEngine(tiny_llama, tok.eos_token_id, tok.pad_token_id)
    context = tiny_llama.config.max_position_embeddings
    short, long = [tok.convert_tokens_to_ids("1")] * 4, [tok.convert_tokens_to_ids("2")] * (context - 2)
    samples = engine.generate([short, long], SamplingParams(max_new_tokens=8), max_new_tokens=[8, 2])
    assert len(samples[1].token_ids) <= 2
    with pytest.raises(ValueError, match="context"):
        engine.generate([short, long], SamplingParams(max_new_tokens=8), max_new_tokens=[8, 3])

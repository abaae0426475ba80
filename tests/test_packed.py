"""Padding-free packed forwards give the padded forward's numbers (log-probs, entropies and
gradients) to float tolerance; on-policy updates see a ratio of exactly 1."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from lmpo.models import completion_outputs
from lmpo.models.logprobs import can_pack, packed_token_outputs
from lmpo.models.packing import Layout, block_causal_mask, choose_layout, pack_completions


def tiny(cls, config_cls, tie: bool, attn: str):
    torch.manual_seed(0)
    config = config_cls(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tie, attn_implementation=attn)
    return cls(config)


def batch():
    torch.manual_seed(1)
    prompt = torch.randint(1, 50, (5, 6))
    prompt_mask = torch.ones(5, 6, dtype=torch.long)
    prompt_mask[0, :3] = 0
    prompt_mask[2, :1] = 0
    return prompt, prompt_mask, torch.randint(1, 50, (5, 9)), torch.tensor([9, 3, 0, 5, 1])


def grads(model):
    out = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    return out


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("cls,config_cls,tie", [(Qwen2ForCausalLM, Qwen2Config, False),  # q/k/v biases, own head
                                                 (Qwen2ForCausalLM, Qwen2Config, True),
                                                 (LlamaForCausalLM, LlamaConfig, True)])
@pytest.mark.parametrize("chunk,share", [(0, False), (7, False), (0, True), (0, "segments"), (7, "segments")])
def test_packed_equals_padded(cls, config_cls, tie, attn, chunk, share):
    model = tiny(cls, config_cls, tie, attn)
    prompt, prompt_mask, completion, lengths = batch()
    segments = share == "segments"
    if segments and attn == "eager":  # eager attention never reaches lmpo's entry: refused, never silently unmasked
        with pytest.raises(RuntimeError, match="0 of 2 attention layers"):
            packed_token_outputs(model, prompt, prompt_mask, completion, lengths, segments=True)
        return
    if share:  # rows 1 and 3, and rows 0 and 4, share their prompts
        prompt[3], prompt_mask[3] = prompt[1], prompt_mask[1]
        prompt[4], prompt_mask[4] = prompt[0], prompt_mask[0]
    valid = torch.arange(9) < lengths[:, None]
    padded = completion_outputs(model, prompt, prompt_mask, completion, 0.7, entropy=True, entropy_grad=True)
    ((padded.logprobs + 0.1 * padded.entropy) * valid).sum().backward()
    padded_grads = grads(model)
    packed = packed_token_outputs(model, prompt, prompt_mask, completion, lengths, 0.7, entropy=True,
                                  entropy_grad=True, chunk_tokens=chunk, share_prompts=share is True, segments=segments)
    ((packed.logprobs + 0.1 * packed.entropy) * valid).sum().backward()
    torch.testing.assert_close(packed.logprobs[valid], padded.logprobs[valid], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed.entropy[valid], padded.entropy[valid], atol=1e-5, rtol=1e-5)
    assert (packed.logprobs[~valid] == 0).all()
    for a, b in zip(grads(model), padded_grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_rows_keep_sequences_apart():
    prompt, prompt_mask, completion, lengths = batch()
    assert pack_completions(prompt, prompt_mask, completion, lengths).input_ids.size(1) == 12  # the longest
    packed = pack_completions(prompt, prompt_mask, completion, lengths, row_tokens=24)
    real = int(prompt_mask.sum(1)[lengths > 0].sum() + lengths.sum())
    assert int((packed.groups >= 0).sum()) == real  # every real token once, nothing of the empty row
    assert packed.input_ids.shape == (2, 24)  # sequences of 12, 11, 9 and 7 tokens: 12 + 11, 9 + 7
    mask = block_causal_mask(packed.groups, packed.branches)[:, 0]
    assert mask.diagonal(dim1=1, dim2=2).all()  # no empty softmax row, padding included
    assert not mask.triu(1).any()  # nothing attends to later tokens
    starts = packed.position_ids == 0
    assert int(starts.sum()) >= int((lengths > 0).sum())  # positions restart at every sequence


def test_a_shared_prompt_is_held_once_and_completions_do_not_see_each_other():
    prompt = torch.tensor([[5, 6, 7]] * 3)
    completion = torch.tensor([[1, 2], [3, 4], [8, 9]])
    packed = pack_completions(prompt, torch.ones_like(prompt), completion, torch.tensor([2, 2, 1]), share_prompts=True)
    assert packed.input_ids.tolist() == [[5, 6, 7, 1, 2, 3, 4, 8]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4, 3, 4, 3]]
    mask = block_causal_mask(packed.groups, packed.branches)[0, 0]
    assert mask[5].tolist() == [True, True, True, False, False, True, False, False]  # 3: the prompt and itself
    assert packed.predictor.tolist() == [2, 3, 2, 5, 2]  # the prompt's last token predicts each first token


def test_layout_follows_the_cost():
    per_token, per_pair = 1000.0, 10.0
    kind = lambda *a, segments=False: choose_layout(*a, per_token, per_pair, 1.0 if segments else None).kind  # noqa: E731
    assert kind([[i] * 5 for i in range(4)], [8, 8, 8, 8]) == "padded"  # nothing to save
    assert kind([[1, 2], [3, 4], [5, 6], [7, 8]], [30, 2, 3, 1]) == "packed"
    assert kind([[1] * 20] * 8, [4] * 8) == "shared"  # long prompt, short answers
    # units of 10 and 6 tokens: rows of 12 hold two of 6 instead of one, worth the wider attention
    assert choose_layout([[i] for i in range(8)], [9] + [5] * 7, per_token, 1.0) == Layout("packed", 12)
    # attention by segments: worth its gathers only where padding or a repeated prompt is saved
    assert kind([[i] * 5 for i in range(4)], [8, 8, 8, 8], segments=True) == "padded"
    assert kind([[1, 2], [3, 4], [5, 6], [7, 8]], [30, 2, 3, 1], segments=True) == "segments"
    assert choose_layout([[1] * 20] * 8, [4] * 8, per_token, per_pair, 1.0) == Layout("segments", 20 + 32)
    # but each bucket's attention call has a fixed cost: many small buckets lose to a dense mask
    assert choose_layout([[1] * 20] * 8, [4] * 8, per_token, per_pair, 1e5).kind == "shared"


def test_segment_plan_allows_exactly_what_the_block_mask_allows():
    from lmpo.models.segments import bucket_segments

    assert bucket_segments([3, 10, 9, 8, 2]) == [[1, 2, 3], [0], [4]]  # down to 0.8 of the longest
    prompt, prompt_mask, completion, lengths = batch()
    prompt[3], prompt_mask[3] = prompt[1], prompt_mask[1]
    packed = pack_completions(prompt, prompt_mask, completion, lengths, segments=True)
    n = packed.input_ids.numel()
    assert packed.input_ids.size(0) == 1 and n == (3 + 9) + (6 + 3 + 5) + (6 + 1)  # the prompt of rows 1 and 3 once
    allowed = torch.zeros(n + 1, n + 1, dtype=torch.bool)
    seen_as_query = []
    for b in packed.plan.buckets:
        for queries, keys, mask in zip(b.queries, b.keys, b.allowed[:, 0]):
            for q, row in zip(queries.tolist(), mask):
                allowed[q, keys[row]] = True
                seen_as_query.append(q)
    real = [q for q in seen_as_query if q < n]
    assert sorted(real) == list(range(n))  # every position is some segment's query exactly once
    assert torch.equal(allowed[:n, :n], block_causal_mask(packed.groups, packed.branches)[0, 0])
    slots = torch.cat([b.queries.reshape(-1) for b in packed.plan.buckets])
    assert torch.equal(slots[packed.plan.order], torch.arange(n))
    from lmpo.models.segments import plan_segments

    with pytest.raises(ValueError, match="exactly once"):  # position 2 belongs to no segment
        plan_segments([([], [0, 1]), ([0, 1], [3])], 4)
    with pytest.raises(ValueError, match="exactly once"):  # position 1 twice
        plan_segments([([], [0, 1]), ([0], [1, 2])], 3)


@pytest.mark.parametrize("bf16", [False, True])  # PyTorch's SDPA per bucket, or lmpo's bf16 function
def test_segments_survive_gradient_checkpointing(bf16):
    model = tiny(Qwen2ForCausalLM, Qwen2Config, False, "sdpa")
    prompt, prompt_mask, completion, lengths = batch()
    valid = torch.arange(9) < lengths[:, None]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        (packed_token_outputs(model, prompt, prompt_mask, completion, lengths, segments=True).logprobs * valid).sum().backward()
    plain = grads(model)
    from lmpo.models import enable_gradient_checkpointing

    enable_gradient_checkpointing(model).train()  # layers recomputed in the backward: the plan must reach them again
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        (packed_token_outputs(model, prompt, prompt_mask, completion, lengths, segments=True).logprobs * valid).sum().backward()
    for a, b in zip(grads(model), plain):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_completion_outputs_chooses_packing_for_long_tails(monkeypatch):
    model = tiny(Qwen2ForCausalLM, Qwen2Config, False, "sdpa")
    assert can_pack(model)
    calls = []
    real = pack_completions
    monkeypatch.setattr("lmpo.models.logprobs.pack_completions", lambda *a, **k: calls.append(1) or real(*a, **k))
    prompt, prompt_mask, completion, lengths = batch()
    completion_outputs(model, prompt, prompt_mask, completion, lengths=lengths)
    assert calls
    completion_outputs(model, torch.randint(1, 50, (5, 6)), torch.ones_like(prompt_mask), completion,
                       lengths=torch.full((5,), 9))
    assert len(calls) == 1


def test_on_policy_ratio_is_exactly_one(monkeypatch):
    from lmpo.trainers.rl_batch import Batch
    from lmpo.trainers.rl_config import RLConfig
    from lmpo.trainers.rl_update import LossParts, micro_step

    model = tiny(Qwen2ForCausalLM, Qwen2Config, False, "sdpa")
    prompt, prompt_mask, completion, lengths = batch()
    loss_mask = (torch.arange(9) < lengths[:, None]).float()
    sampler = completion_outputs(model, prompt, prompt_mask, completion).logprobs.detach() + 1e-3  # not bit-equal
    part = Batch(prompt, prompt_mask, completion, loss_mask, sampler, advantages=torch.randn(5, 1).expand(5, 9))
    cfg = RLConfig()
    parts = LossParts.from_config(cfg)
    seen = []
    loss = parts.policy_loss
    parts.policy_loss = lambda new, old, *a, **k: seen.append((new - old).detach()) or loss(new, old, *a, **k)
    counts = {"num_sequences": 4, "num_tokens": float(loss_mask.sum()), "max_len": 9}
    micro_step(model, part, cfg, parts, counts, 0.0, on_policy=True)
    assert (seen[0] == 0).all()
    micro_step(model, part, cfg, parts, counts, 0.0, on_policy=False)
    assert (seen[1][loss_mask.bool()] != 0).all()


@pytest.mark.parametrize("kind", ["shared", "segments"])
def test_packed_reward_scores_equal_padded(kind, monkeypatch):
    from transformers import Qwen2ForSequenceClassification

    from lmpo.envs.data import PreferencePair
    from lmpo.models.packing import trunk_layout
    from lmpo.models.padding import left_pad
    from lmpo.trainers.pairs import scoring_rows
    from lmpo.trainers.reward_model import pair_scores, scores

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, num_labels=1, pad_token_id=0)
    model = Qwen2ForSequenceClassification(config)
    pairs = [PreferencePair([3, 4, 5], [6, 7], [8, 9, 10, 11]),
             PreferencePair([12], [13, 14, 15, 16, 17], [18])]
    prompts, prompt_mask = left_pad([p.prompt_ids for p in pairs] * 2, 0)
    lengths = torch.tensor([len(p.chosen_ids) for p in pairs] + [len(p.rejected_ids) for p in pairs])
    assert trunk_layout(model.model, prompts, prompt_mask, lengths).kind != "padded"  # so pair_scores packs
    monkeypatch.setattr("lmpo.trainers.reward_model.trunk_layout", lambda *a: Layout(kind, 0))
    padded = scores(model, *scoring_rows(pairs, 0))
    padded.sum().backward()
    padded_grads = grads(model)
    packed = pair_scores(model, pairs, 0, "cpu")
    packed.sum().backward()
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=1e-5)
    for a, b in zip(grads(model), padded_grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_the_layout_of_a_batch_is_costed_once_and_stays_the_same():
    from lmpo.models.packing import choose_layout, real_prompts

    prompts = real_prompts(torch.tensor([[0, 5, 6], [7, 8, 9]]), torch.tensor([[0, 1, 1], [1, 1, 1]]))
    assert prompts == [[5, 6], [7, 8, 9]]
    first = choose_layout(prompts, [4, 2], 100.0, 1.0)
    assert choose_layout([list(p) for p in prompts], [4, 2], 100.0, 1.0) is first  # remembered
    assert choose_layout(prompts, [4, 3], 100.0, 1.0) is not first


def test_a_rendered_prompt_is_a_fresh_list_each_time(char_tokenizer):
    from lmpo.rollout.render import TextRenderer

    renderer = TextRenderer(char_tokenizer)
    ids, text = renderer.prompt([{"role": "user", "content": "31415="}])
    ids.append(0)  # a caller's change never reaches the next episode's prompt
    again, _ = renderer.prompt([{"role": "user", "content": "31415="}])
    assert again == char_tokenizer("31415=", add_special_tokens=False).input_ids and text == "31415="


@pytest.mark.parametrize("segments", [True, False])  # attention by segments, or one row under a block mask
def test_packed_under_cpu_bf16_autocast_stays_close_to_fp32(segments, monkeypatch):
    import lmpo.models.segments as attention

    calls = []
    real = attention.matmul_segment_attention
    monkeypatch.setattr(attention, "matmul_segment_attention",
                        lambda *a: calls.append(torch.is_autocast_enabled("cpu")) or real(*a))
    model = tiny(Qwen2ForCausalLM, Qwen2Config, False, "sdpa")
    prompt, prompt_mask, completion, lengths = batch()
    prompt[3], prompt_mask[3] = prompt[1], prompt_mask[1]
    valid = torch.arange(9) < lengths[:, None]
    exact_out = packed_token_outputs(model, prompt, prompt_mask, completion, lengths, segments=segments)
    (exact_out.logprobs * valid).sum().backward()
    exact = grads(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fast = packed_token_outputs(model, prompt, prompt_mask, completion, lengths, segments=segments)
    reference = packed_token_outputs(model, prompt, prompt_mask, completion, lengths, segments=segments)
    # by segments, the matmul path ran under autocast (one call per layer), never in fp32
    assert calls == ([True, True] if segments else [])
    (fast.logprobs * valid).sum().backward()
    torch.testing.assert_close(fast.logprobs[valid].float(), reference.logprobs[valid].detach(), atol=0.05, rtol=0.02)
    for a, b in zip(grads(model), exact):
        assert torch.isfinite(a).all() and (a - b).norm() <= 0.05 * b.norm() + 1e-6


@pytest.mark.parametrize("share", [True, "segments"])
def test_shared_prompt_gradients_are_bit_identical_on_every_run(share):
    """A shared prompt's last position predicts the first token of every completion in its group:
    the gather of hidden states repeats that position, and its backward must add the repeats in
    a fixed order. (Advanced indexing adds them with atomic adds across threads, so the sum's
    rounding depended on which thread got there first: reruns under load drifted apart.)"""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        model = tiny(Qwen2ForCausalLM, Qwen2Config, False, "sdpa")
        torch.manual_seed(2)
        n = 1024  # enough gathered values (n * 3 * hidden) for the backward to run on both threads
        prompt, prompt_mask = torch.randint(1, 50, (1, 4)).repeat(n, 1), torch.ones(n, 4, dtype=torch.long)
        completion, lengths = torch.randint(1, 50, (n, 3)), torch.full((n,), 3)
        seen = set()
        for _ in range(8):
            out = packed_token_outputs(model, prompt, prompt_mask, completion, lengths, share_prompts=share is True,
                                       segments=share == "segments")
            (out.logprobs * torch.linspace(0.5, 1.5, out.logprobs.numel()).view_as(out.logprobs)).sum().backward()
            seen.add(tuple(p.grad.numpy().tobytes() for p in model.parameters()))
            model.zero_grad()
        assert len(seen) == 1
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("kind", ["mistral", "qwen2_sliding", "gemma3"])
@pytest.mark.parametrize("window, packs", [(16, True), (8, False)])  # the longest sequence: 6 + 9 tokens
def test_a_sliding_window_model_packs_only_sequences_shorter_than_its_window(kind, window, packs, monkeypatch):
    """A packed forward masks by its own block mask, without the window: Mistral's log-probs came out
    0.1 away from its padded forward once a prompt and completion passed the window."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, MistralConfig, MistralForCausalLM

    shape = dict(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=64, attn_implementation="sdpa", sliding_window=window)
    torch.manual_seed(0)
    model = {"mistral": lambda: MistralForCausalLM(MistralConfig(**shape)),
             "qwen2_sliding": lambda: Qwen2ForCausalLM(Qwen2Config(**shape, use_sliding_window=True,
                                                                   max_window_layers=1)),
             "gemma3": lambda: Gemma3ForCausalLM(Gemma3TextConfig(**shape, head_dim=8, sliding_window_pattern=2))
             }[kind]().eval()
    calls = []
    real = pack_completions
    monkeypatch.setattr("lmpo.models.logprobs.pack_completions", lambda *a, **k: calls.append(1) or real(*a, **k))
    prompt, prompt_mask, completion, lengths = batch()
    got = completion_outputs(model, prompt, prompt_mask, completion, lengths=lengths).logprobs
    packed = bool(calls)
    want = completion_outputs(model, prompt, prompt_mask, completion).logprobs  # padded: transformers' own masks
    wanted = torch.arange(completion.size(1))[None, :] < lengths[:, None]
    torch.testing.assert_close(got[wanted], want[wanted], atol=1e-5, rtol=1e-5)
    assert packed == packs


def test_a_model_with_attention_code_of_its_own_packs_under_a_mask_not_by_segments():
    """Falcon loads as SDPA but runs its own attention, which ignores a segment plan: the cost
    model chose segments for it on a GRPO-shaped batch, and the first forward stopped the run."""
    from transformers import FalconConfig, FalconForCausalLM, GPT2Config, GPT2LMHeadModel

    from lmpo.models.logprobs import causal_lm_parts, layout_for
    from lmpo.models.packing import can_segment_trunk

    torch.manual_seed(0)
    falcon = FalconForCausalLM(FalconConfig(vocab_size=50, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                            new_decoder_architecture=False))
    prompt = torch.randint(1, 50, (8, 16)).repeat_interleave(8, 0)
    mask, completion, lengths = torch.ones_like(prompt), torch.randint(1, 50, (64, 64)), torch.randint(20, 65, (64,))
    assert not can_segment_trunk(causal_lm_parts(falcon)[0])
    assert layout_for(falcon, prompt, mask, lengths).kind in ("packed", "shared")
    valid = torch.arange(64) < lengths[:, None]
    with torch.no_grad():
        packed = completion_outputs(falcon, prompt, mask, completion, lengths=lengths)
        padded = completion_outputs(falcon, prompt, mask, completion)
    torch.testing.assert_close(packed.logprobs[valid], padded.logprobs[valid], atol=1e-5, rtol=1e-5)
    # a model whose attention goes through transformers' entry is asked too, without a draw from the run's
    # random streams (its dropout on, in train mode)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.5)).train()
    state = torch.get_rng_state()
    assert can_segment_trunk(causal_lm_parts(gpt2)[0])
    assert torch.equal(torch.get_rng_state(), state)
    assert gpt2.training and all(m.training for m in gpt2.modules())  # asked in eval mode, then put back


@pytest.mark.parametrize("kind", ["mpt", "bloom", "falcon_alibi"])
def test_an_alibi_model_runs_padded_and_scores_each_sequence_as_it_scores_it_alone(kind):
    """ALiBi models build their attention bias from the 2-D mask or from a token's place in the
    row, not from position ids: with a shared prompt MPT's packed log-probs were 0.6 off, and
    Bloom's and Falcon's (with `alibi`) packed forwards raised."""
    from transformers import BloomConfig, BloomForCausalLM, FalconConfig, FalconForCausalLM, MptConfig, MptForCausalLM

    torch.manual_seed(0)
    model = {"mpt": lambda: MptForCausalLM(MptConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=4)),
             "bloom": lambda: BloomForCausalLM(BloomConfig(vocab_size=50, hidden_size=32, n_layer=2, n_head=4)),
             "falcon_alibi": lambda: FalconForCausalLM(FalconConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2,
                                                                    num_attention_heads=4, alibi=True))}[kind]().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    prompt = torch.randint(1, 50, (1, 5)).repeat(4, 1)  # one prompt, a GRPO group of four
    prompt_mask, completion = torch.ones_like(prompt), torch.randint(1, 50, (4, 9))
    lengths = torch.tensor([9, 4, 7, 2])
    assert not can_pack(model)
    with torch.no_grad():
        got = completion_outputs(model, prompt, prompt_mask, completion, lengths=lengths).logprobs
        for b in range(4):
            alone = torch.log_softmax(model(input_ids=torch.cat([prompt[b], completion[b, :lengths[b]]])[None]).logits[0], -1)
            want = alone[4:4 + lengths[b]].gather(1, completion[b, :lengths[b], None])[:, 0]
            torch.testing.assert_close(got[b, :lengths[b]], want, atol=1e-5, rtol=1e-5)


def test_the_packing_checks_follow_a_switch_of_attention_implementation():
    from lmpo.models.packing import can_segment_trunk

    model = tiny(Qwen2ForCausalLM, Qwen2Config, False, "eager")
    assert not can_segment_trunk(model.model)  # eager attention takes no segment plan
    model.set_attn_implementation("sdpa")
    assert can_segment_trunk(model.model)  # asked again for SDPA, not the eager answer kept

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lmpo.models import PRESETS, count_parameters, load_model_and_tokenizer, save_model


def test_char_tokenizer_round_trip_and_reload(char_tokenizer, tmp_path):
    text = "31415=11345 Hello, world!\n(x) = 42"
    ids = char_tokenizer(text, add_special_tokens=False).input_ids
    assert len(ids) == len(text)  # one token per character
    assert char_tokenizer.decode(ids) == text
    char_tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded(text, add_special_tokens=False).input_ids == ids
    assert (reloaded.pad_token, reloaded.eos_token) == ("<pad>", "<eos>")
    chat = reloaded.apply_chat_template([{"role": "user", "content": "12="}, {"role": "assistant", "content": "3"}],
                                        tokenize=False)
    assert chat == "<|user|>12=<|assistant|>3<eos>"


def test_presets_have_the_promised_sizes():
    model, tok = load_model_and_tokenizer("tiny")
    assert 1e6 <= count_parameters(model) <= 5e6
    assert set(PRESETS) >= {"tiny", "small"}
    assert model.config.pad_token_id == tok.pad_token_id and model.config.eos_token_id == tok.eos_token_id


def test_preset_init_is_seeded():
    a, _ = load_model_and_tokenizer("tiny", seed=3)
    b, _ = load_model_and_tokenizer("tiny", seed=3)
    c, _ = load_model_and_tokenizer("tiny", seed=4)
    wa, wb, wc = (m.model.layers[0].mlp.up_proj.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


def test_saved_model_loads_with_plain_transformers(tmp_path):
    model, tok = load_model_and_tokenizer("tiny", seed=0)
    save_model(model, tok, tmp_path / "m")
    assert (tmp_path / "m" / "model.safetensors").exists()
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    plain_tok = AutoTokenizer.from_pretrained(tmp_path / "m")
    ids = torch.tensor([plain_tok("31415=").input_ids])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, plain(ids).logits, atol=1e-6)


def test_saving_a_model_draws_no_progress_bar_and_leaves_the_setting_as_it_was(tmp_path, capfd):
    """The Python API printed transformers' "Writing model shards" bar at every save (every
    checkpoint of a run); the CLI, which turns the bars off for its process, did not."""
    from transformers.utils import logging

    model, tokenizer = load_model_and_tokenizer("tiny")
    logging.enable_progress_bar()
    save_model(model, tokenizer, tmp_path / "m")
    assert "Writing model shards" not in capfd.readouterr().err
    assert logging.is_progress_bar_enabled()  # a caller's own setting is kept


def test_users_local_hf_model_directory_loads_through_the_same_path(tiny_qwen2, char_tokenizer, tmp_path):
    tiny_qwen2.save_pretrained(tmp_path)
    char_tokenizer.save_pretrained(tmp_path)
    model, tok = load_model_and_tokenizer(str(tmp_path))
    assert type(model).__name__ == "Qwen2ForCausalLM"
    ids = torch.tensor([tok("12=").input_ids])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, tiny_qwen2(ids).logits, atol=1e-6)


def test_tokenizer_without_pad_token_uses_eos(tiny_llama, tmp_path):
    from transformers import PreTrainedTokenizerFast
    from lmpo.models import build_char_tokenizer

    base = build_char_tokenizer()
    no_pad = PreTrainedTokenizerFast(tokenizer_object=base.backend_tokenizer, eos_token="<eos>")
    tiny_llama.save_pretrained(tmp_path)
    no_pad.save_pretrained(tmp_path)
    _, tok = load_model_and_tokenizer(str(tmp_path))
    assert tok.pad_token == "<eos>"


def test_a_directory_that_is_not_a_model_gives_a_clear_error(tmp_path):
    import pytest

    (tmp_path / "tokenizer.json").write_text("{}")
    from lmpo.models import load_model, build_char_tokenizer
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_model(str(tmp_path), build_char_tokenizer())


def test_a_checkpoint_missing_weights_of_the_causal_lm_is_refused(char_tokenizer, tmp_path):
    """A reward model's directory (untied head) given as --model loaded as a causal LM whose
    lm_head transformers initialised at random, its report silenced: the policy sampled noise."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from lmpo.models import load_model

    config = LlamaConfig(vocab_size=len(char_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=False, num_labels=1,
                         pad_token_id=char_tokenizer.pad_token_id)
    LlamaForSequenceClassification(config).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r": its checkpoint has no lm_head.weight, which would start from random "
                                         r"values: it was saved as a LlamaForSequenceClassification, not a causal LM"):
        load_model(str(tmp_path), char_tokenizer)


def test_a_reward_models_checkpoint_with_a_tied_head_is_refused_too(char_tokenizer, tmp_path):
    """Tied, the output head is the embedding: nothing is missing, and the reward model's trunk
    used to load as a language model that nobody trained as one."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from lmpo.models import load_model

    config = LlamaConfig(vocab_size=len(char_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True, num_labels=1,
                         pad_token_id=char_tokenizer.pad_token_id)
    LlamaForSequenceClassification(config).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"it was saved as a LlamaForSequenceClassification, not a causal LM; give"):
        load_model(str(tmp_path), char_tokenizer)


def test_a_run_directory_given_as_the_model_names_the_models_it_holds(tmp_path):
    """`--model runs/pipeline` (or a stage's run directory) was refused with only "no config.json";
    the error now names the saved models one level further in."""
    import pytest

    from lmpo.models import build_char_tokenizer, load_model

    for stage in ("cpt", "sft"):
        (tmp_path / stage / "model").mkdir(parents=True)
        (tmp_path / stage / "model" / "config.json").write_text("{}")
    (tmp_path / "logs").mkdir()
    with pytest.raises(FileNotFoundError, match=rf"it holds models: {tmp_path}/cpt/model, {tmp_path}/sft/model$"):
        load_model(str(tmp_path), build_char_tokenizer())
    with pytest.raises(FileNotFoundError, match=rf"it holds a model: {tmp_path}/sft/model; give {tmp_path}/sft/model instead$"):
        load_model(str(tmp_path / "sft"), build_char_tokenizer())
    # an interrupted run has no model/ yet: its newest complete checkpoint holds the weights
    for step, complete in ((2, True), (4, True), (6, False)):
        checkpoint = tmp_path / "rl" / "checkpoints" / f"step_{step:06d}"
        checkpoint.mkdir(parents=True)
        (checkpoint / "config.json").write_text("{}")
        if complete:
            (checkpoint / "COMPLETE").write_text("")
    with pytest.raises(FileNotFoundError, match=rf"it holds a model: {tmp_path}/rl/checkpoints/step_000004; give "):
        load_model(str(tmp_path / "rl"), build_char_tokenizer())


def test_an_rl_run_directory_given_as_the_model_is_told_its_model(tmp_path, capsys):
    """An RL run directory has a config.json (its options), so it passed for a model directory and
    `lmpo eval --model runs/base` said "runs/base has no tokenizer ... save the tokenizer beside it"."""
    from lmpo.cli.main import main

    run = tmp_path / "base"
    (run / "model").mkdir(parents=True)
    (run / "model" / "config.json").write_text('{"model_type": "qwen2"}')
    (run / "config.json").write_text('{"model": "models/qwen2", "steps": 6}')
    (run / "run.json").write_text('{"trainer": "rl", "command": "ppo", "config": {}}')
    (run / "result.json").write_text("{}")
    assert main(["eval", "--model", str(run), "--eval_problems", "4"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"lmpo: error: {run} is not a Hugging Face model directory: a run directory (its config.json holds the "
        f"run's options); it holds a model: {run}/model; give {run}/model instead")

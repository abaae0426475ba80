import os

import pytest
import torch

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
torch.set_num_threads(2)


@pytest.fixture(scope="session")
def char_tokenizer():
    from lmpo.models import build_char_tokenizer

    return build_char_tokenizer()


@pytest.fixture(scope="session")
def tiny_llama(char_tokenizer):
    """A very small Llama with the embedded tokenizer (random weights)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(char_tokenizer), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings=128, tie_word_embeddings=True,
                         pad_token_id=char_tokenizer.pad_token_id, eos_token_id=char_tokenizer.eos_token_id)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="session")
def tiny_qwen2(char_tokenizer):
    """A very small Qwen2 (QKV bias, grouped-query attention, untied head)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(1)
    config = Qwen2Config(vocab_size=len(char_tokenizer), hidden_size=64, intermediate_size=96,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128, tie_word_embeddings=False,
                         pad_token_id=char_tokenizer.pad_token_id, eos_token_id=char_tokenizer.eos_token_id)
    return Qwen2ForCausalLM(config).eval()


@pytest.fixture(scope="session")
def start_model(tmp_path_factory, tiny_llama, char_tokenizer):
    """`tiny_llama` and the embedded tokenizer saved as a Hugging Face model directory."""
    path = tmp_path_factory.mktemp("start")
    tiny_llama.save_pretrained(path)
    char_tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture
def no_stage_runs(monkeypatch):
    """A pipeline's first stage (CPT) fails the test if it starts: for refusals that must come
    before anything runs (and that, missing, would otherwise train for minutes)."""
    def train_cpt(cfg):
        raise AssertionError("CPT ran: the pipeline was not refused before its first stage")

    monkeypatch.setattr("lmpo.trainers.pipeline.train_cpt", train_cpt)

"""The vLLM engine's pure parts and the engine choice, on CPU without vLLM.

The mapping tests feed stand-in objects of the shape of vLLM's `RequestOutput` to the mapping
functions: they check lmpo's reading of that shape, not that vLLM ran (it cannot run here)."""

from types import SimpleNamespace

import pytest
import torch

from lmpo.rollout import FINISH_EOS, FINISH_LENGTH, LocalEngine, SamplingParams
from lmpo.rollout.engine_select import (INSTALL_HINT, EngineUnavailableError, VLLMAvailability, choose_engine,
                                        make_engine, vllm_availability)
from lmpo.rollout.vllm_engine import (WeightSyncError, hf_weight_items, load_full_weights, prompt_token_logprobs,
                                      samples_from_outputs, vllm_sampling_kwargs)

EOS = 2


def _logprob(value):
    return SimpleNamespace(logprob=value, rank=1, decoded_token=None)


def _output(tokens, logprobs, finish_reason, stop_reason=None, prompt_logprobs=None):
    """A stand-in with the shape of vllm.RequestOutput holding one CompletionOutput."""
    entries = [{t: _logprob(lp), 999: _logprob(-9.0)} for t, lp in zip(tokens, logprobs)]
    completion = SimpleNamespace(index=0, token_ids=tokens, logprobs=entries, finish_reason=finish_reason,
                                 stop_reason=stop_reason, text="", cumulative_logprob=sum(logprobs))
    return SimpleNamespace(outputs=[completion], prompt_logprobs=prompt_logprobs)


def test_mapping_request_outputs_to_samples():
    outputs = [_output([5, 7, EOS], [-0.1, -0.2, -0.3], "stop", stop_reason=EOS),
               _output([5, 6, 8], [-1.0, -2.0, -3.0], "length"),
               _output([4, 4, 4, 4], [-0.5] * 4, "length")]
    samples = samples_from_outputs(outputs, {EOS}, caps=[8, 3, 2])
    assert (samples[0].token_ids, samples[0].logprobs, samples[0].finish_reason) == ([5, 7, EOS], [-0.1, -0.2, -0.3],
                                                                                      FINISH_EOS)
    assert samples[1].finish_reason == FINISH_LENGTH and samples[1].logprobs == [-1.0, -2.0, -3.0]
    assert (samples[2].token_ids, samples[2].logprobs, samples[2].finish_reason) == ([4, 4], [-0.5, -0.5], FINISH_LENGTH)


def test_mapping_rejects_outputs_lmpo_cannot_train_on():
    with pytest.raises(ValueError, match="left it out"):
        samples_from_outputs([_output([5, 7], [-0.1, -0.2], "stop", stop_reason=EOS)], {EOS}, [8])
    with pytest.raises(RuntimeError, match="abort"):
        samples_from_outputs([_output([5], [-0.1], "abort")], {EOS}, [8])
    missing = _output([5], [-0.1], "length")
    missing.outputs[0].logprobs = None
    with pytest.raises(ValueError, match="logprobs=0"):
        samples_from_outputs([missing], {EOS}, [8])
    with pytest.raises(ValueError, match="2 vLLM outputs for 1"):
        samples_from_outputs([missing, missing], {EOS}, [8])


def test_mapping_prompt_logprobs():
    ids = [10, 11, 12, 13]
    prompt_logprobs = [None, {11: _logprob(-1.0), 50: _logprob(-0.1)}, {12: _logprob(-2.0)}, {13: _logprob(-3.0)}]
    assert prompt_token_logprobs(prompt_logprobs, ids, start=2) == [-2.0, -3.0]
    assert prompt_token_logprobs(prompt_logprobs, ids, start=1) == [-1.0, -2.0, -3.0]
    with pytest.raises(ValueError, match="prompt log-probs"):
        prompt_token_logprobs(None, ids, 1)


def test_sampling_arguments():
    kwargs = vllm_sampling_kwargs(SamplingParams(temperature=0.7, top_p=0.9, top_k=0, max_new_tokens=64), 12, [EOS, 3])
    assert kwargs == {"n": 1, "temperature": 0.7, "top_p": 0.9, "top_k": -1, "max_tokens": 12, "logprobs": 0,
                      "ignore_eos": True, "stop_token_ids": [EOS, 3], "detokenize": False}
    assert vllm_sampling_kwargs(SamplingParams(top_k=20), 5, [EOS])["top_k"] == 20


class _RecordingModel:
    def __init__(self):
        self.loaded = []

    def load_weights(self, weights):
        self.loaded = [name for name, _ in weights]


def test_weight_loading_paths_with_stand_ins(tiny_llama):
    target = _RecordingModel()
    runner = SimpleNamespace(model=target)
    in_process = SimpleNamespace(llm_engine=SimpleNamespace(model_executor=SimpleNamespace(
        driver_worker=SimpleNamespace(worker=SimpleNamespace(model_runner=runner)))))
    assert load_full_weights(in_process, lambda: hf_weight_items(tiny_llama), "0.x") == "in-process model"
    assert target.loaded == list(tiny_llama.state_dict())

    applied = _RecordingModel()
    newer = SimpleNamespace(llm_engine=SimpleNamespace(), apply_model=lambda fn: [fn(applied)])
    assert load_full_weights(newer, lambda: hf_weight_items(tiny_llama), "0.y") == "LLM.apply_model"
    assert applied.loaded == list(tiny_llama.state_dict())

    with pytest.raises(WeightSyncError, match=r"vLLM 9\.9\.9; tried: in-process model.*LLM.apply_model: not in"):
        load_full_weights(SimpleNamespace(), lambda: hf_weight_items(tiny_llama), "9.9.9")


def test_weight_names_drop_wrapper_prefixes():
    wrapped = torch.nn.Module()
    wrapped._orig_mod = torch.nn.Linear(2, 2)
    assert [name for name, _ in hf_weight_items(wrapped)] == ["weight", "bias"]


@pytest.mark.parametrize("availability, missing", [(VLLMAvailability(False, False), "vllm is not installed"),
                                                   (VLLMAvailability(True, False, "0.11.0"), "no CUDA GPU")])
def test_engine_vllm_fails_clearly_where_it_cannot_run(availability, missing):
    with pytest.raises(EngineUnavailableError, match=missing) as err:
        choose_engine("vllm", availability)
    assert INSTALL_HINT in str(err.value) and "engine=local" in str(err.value)


def test_engine_auto_choices():
    usable = VLLMAvailability(True, True, "0.11.0")
    assert choose_engine("auto", usable) == ("vllm", "[engine] vllm 0.11.0, colocated on the GPU")
    chosen, message = choose_engine("auto", VLLMAvailability(False, True))
    assert chosen == "local" and "vllm is not installed" in message and "pip install vllm" in message
    assert "\n" not in message
    assert choose_engine("auto", usable, trainer_device="cpu")[0] == "local"
    assert choose_engine("local", usable) == ("local", "")
    with pytest.raises(ValueError, match="auto, local or vllm"):
        choose_engine("sglang", usable)


def test_make_engine_falls_back_to_the_builtin_engine(tiny_llama, char_tokenizer):
    lines = []
    engine = make_engine("auto", tiny_llama, char_tokenizer, availability=VLLMAvailability(False, False),
                         log=lines.append)
    assert isinstance(engine, LocalEngine) and len(lines) == 1 and "built-in engine" in lines[0]
    assert isinstance(make_engine("local", tiny_llama, char_tokenizer, log=lines.append), LocalEngine)
    assert len(lines) == 1


def test_availability_is_read_without_importing_vllm(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert vllm_availability() == VLLMAvailability(False, False, "")


def test_trust_remote_code_reaches_vllm(monkeypatch, tiny_llama, char_tokenizer, tmp_path):
    """A model with its own code that the trainer loaded with --trust_remote_code is loaded the
    same way by vLLM (a stand-in `vllm` module records what `LLM` is given)."""
    import sys

    import lmpo.rollout.vllm_engine as vllm_engine

    made = []
    fake = SimpleNamespace(__version__="0.11.0", LLM=lambda **kwargs: made.append(kwargs) or SimpleNamespace())
    monkeypatch.setitem(sys.modules, "vllm", fake)
    vllm_engine.VLLMEngine(str(tmp_path), char_tokenizer, trust_remote_code=True)
    vllm_engine.VLLMEngine(str(tmp_path), char_tokenizer)
    assert [m["trust_remote_code"] for m in made] == [True, False]

    given = []

    class Recording:
        def __init__(self, model_dir, tokenizer, **kwargs):
            given.append(kwargs)

        def sync_weights(self, model):
            pass

    monkeypatch.setattr(vllm_engine, "VLLMEngine", Recording)
    tiny_llama.save_pretrained(tmp_path / "m")
    make_engine("vllm", tiny_llama, char_tokenizer, str(tmp_path / "m"), availability=VLLMAvailability(True, True, "0.11.0"),
                trust_remote_code=True, log=lambda line: None)
    assert given[0]["trust_remote_code"] is True


def test_engine_vllm_where_it_cannot_run_is_refused_before_anything_is_written(tmp_path, monkeypatch, capsys):
    """It was found only when the engine was made: after the model loaded, with the run directory
    written, as a traceback (the error was a RuntimeError the command line did not expect); in a
    pipeline, after CPT and SFT had run."""
    import lmpo.rollout.engine_select as engine_select
    from lmpo.cli.main import main

    monkeypatch.setattr(engine_select, "vllm_availability", lambda: VLLMAvailability(False, False))
    for argv in (["train", "grpo", "--model", "tiny"], ["train", "rft", "--model", "tiny"],
                 ["pipeline", "--rl_stage.engine", "vllm"], ["pipeline", "--rl", "rft", "--rft.engine", "vllm"]):
        out = tmp_path / argv[1]
        engine = [] if argv[0] == "pipeline" else ["--engine", "vllm"]
        assert main([*argv, *engine, "--out", str(out)]) == 2, argv
        assert capsys.readouterr().err.startswith("lmpo: error: engine=vllm: vllm is not installed"), argv
        assert not out.exists(), argv

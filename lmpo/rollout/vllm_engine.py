"""A colocated vLLM engine: vLLM samples the rollouts on the trainer's GPU, in the trainer's
process, and receives the trainer's weights after every update.

vLLM is imported lazily, only when a `VLLMEngine` is built, so lmpo runs without it. The
mapping of vLLM's outputs to lmpo's `Sample` records is kept in pure functions
(`samples_from_outputs`, `prompt_token_logprobs`) that take any objects of vLLM's
`RequestOutput` shape. Not run on a GPU in lmpo's own test suite: see docs/vllm.md.
"""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
import warnings
from typing import Any, Callable, Iterable, Sequence

import torch

from lmpo.rollout.trajectory import Sample
from lmpo.rollout.types import FINISH_EOS, FINISH_LENGTH, SamplingParams


class WeightSyncError(RuntimeError):
    """No known way to load the trainer's weights into this vLLM version."""


# ---- pure mapping: vLLM RequestOutput-shaped objects -> lmpo records ------------------------

def _logprob_value(entry: Any, token: int, position: int) -> float:
    if entry is None or token not in entry:
        raise ValueError(f"vLLM returned no log-prob for token {token} at position {position}")
    value = entry[token]
    return float(getattr(value, "logprob", value))


def sampled_logprobs(logprobs: Sequence[Any] | None, tokens: Sequence[int]) -> list[float]:
    """The log-prob of each sampled token from vLLM's per-position {token id: Logprob} maps."""
    if logprobs is None:
        raise ValueError("vLLM returned no log-probs: the request must set SamplingParams(logprobs=0)")
    if len(logprobs) != len(tokens):
        raise ValueError(f"vLLM returned {len(logprobs)} log-prob entries for {len(tokens)} tokens")
    return [_logprob_value(entry, token, i) for i, (entry, token) in enumerate(zip(logprobs, tokens))]


def finish_reason(reason: str | None, stop_reason: Any, tokens: Sequence[int], eos_ids: set[int]) -> str:
    """lmpo's ending: FINISH_EOS when the last token is one of `eos_ids` (lmpo's, which vLLM was
    told to stop on), FINISH_LENGTH for any other finish (cut off, so not terminated)."""
    if tokens and tokens[-1] in eos_ids:
        return FINISH_EOS
    if reason == "stop" and stop_reason in eos_ids:
        raise ValueError(f"vLLM stopped on EOS token {stop_reason} but left it out of the output ids; lmpo trains the "
                         f"EOS the model sampled and cannot use this output")
    if reason in ("length", "stop"):
        return FINISH_LENGTH
    raise RuntimeError(f"vLLM ended a request with finish_reason={reason!r} (aborted or unfinished)")


def samples_from_outputs(outputs: Sequence[Any], eos_ids: set[int], caps: Sequence[int]) -> list[Sample]:
    """`Sample`s from vLLM `RequestOutput`s (one completion each): token ids, the sampled
    tokens' log-probs, and lmpo's finish reason; a completion longer than its cap is cut there
    and counts as cut off (what generating with the smaller cap would have given)."""
    if len(outputs) != len(caps):
        raise ValueError(f"{len(outputs)} vLLM outputs for {len(caps)} prompts")
    samples = []
    for output, cap in zip(outputs, caps):
        completion = output.outputs[0]
        tokens = [int(t) for t in completion.token_ids]
        logprobs = sampled_logprobs(completion.logprobs, tokens)
        reason = finish_reason(completion.finish_reason, getattr(completion, "stop_reason", None), tokens, eos_ids)
        if len(tokens) > cap:
            tokens, logprobs, reason = tokens[:cap], logprobs[:cap], FINISH_LENGTH
        samples.append(Sample(tokens, logprobs, reason))
    return samples


def prompt_token_logprobs(prompt_logprobs: Sequence[Any] | None, ids: Sequence[int], start: int) -> list[float]:
    """Log-probs of `ids[start:]` from vLLM's `RequestOutput.prompt_logprobs` (entry 0 is None)."""
    if prompt_logprobs is None or len(prompt_logprobs) != len(ids):
        raise ValueError("vLLM returned no prompt log-probs for every prompt token (SamplingParams(prompt_logprobs=...))")
    return [_logprob_value(prompt_logprobs[i], ids[i], i) for i in range(start, len(ids))]


def vllm_sampling_kwargs(params: SamplingParams, cap: int, eos_ids: Sequence[int]) -> dict:
    """`vllm.SamplingParams` arguments for one prompt: lmpo's EOS ids are the only stop tokens
    (`ignore_eos` drops the model config's own, which lmpo may not train as an ending)."""
    return {"n": 1, "temperature": params.temperature, "top_p": params.top_p,
            "top_k": params.top_k if params.top_k > 0 else -1, "max_tokens": cap, "logprobs": 0,
            "ignore_eos": True, "stop_token_ids": list(eos_ids), "detokenize": False}


def hf_weight_items(model: torch.nn.Module) -> Iterable[tuple[str, torch.Tensor]]:
    """(name, tensor) in Hugging Face checkpoint naming, which vLLM's `load_weights` maps onto its
    fused layers; wrappers' prefixes (torch.compile, DDP) are dropped."""
    for name, tensor in model.state_dict().items():
        for prefix in ("_orig_mod.", "module."):
            name = name.removeprefix(prefix)
        yield name, tensor.detach()


def is_peft_model(model: torch.nn.Module) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


# ---- weight loading into a running vLLM --------------------------------------------------------

def _runner_model(runner: Any) -> Any:
    return runner.get_model() if hasattr(runner, "get_model") else runner.model


def _in_process_model(llm: Any) -> Any | None:
    """vLLM's model when the engine runs in this process (V0, or V1 without multiprocessing)."""
    worker = getattr(getattr(getattr(llm, "llm_engine", None), "model_executor", None), "driver_worker", None)
    for candidate in (getattr(worker, "worker", None), worker):
        runner = getattr(candidate, "model_runner", None)
        if runner is not None:
            return _runner_model(runner)
    return None


def load_full_weights(llm: Any, weights: Callable[[], Iterable[tuple[str, torch.Tensor]]], version: str) -> str:
    """Load `weights()` into the running model, trying the known paths in turn: the in-process
    model (V0; V1 with VLLM_ENABLE_V1_MULTIPROCESSING=0), `LLM.apply_model` and
    `LLM.collective_rpc` (newer V1). Returns the path used."""
    errors = []
    model = _in_process_model(llm)
    if model is not None:
        try:
            model.load_weights(weights())
            return "in-process model"
        except Exception as err:  # noqa: BLE001 - reported with the others below
            errors.append(f"in-process model: {type(err).__name__}: {err}")
    else:
        errors.append("in-process model: llm.llm_engine.model_executor.driver_worker has no model_runner")
    calls = [("apply_model", lambda: llm.apply_model(lambda m: m.load_weights(weights()))),
             ("collective_rpc", lambda: llm.collective_rpc(
                 lambda worker: _runner_model(worker.model_runner).load_weights(weights())))]
    for name, call in calls:
        if not hasattr(llm, name):
            errors.append(f"LLM.{name}: not in this version")
            continue
        try:
            call()
            return f"LLM.{name}"
        except Exception as err:  # noqa: BLE001
            errors.append(f"LLM.{name}: {type(err).__name__}: {err}")
    raise WeightSyncError(f"could not load the trainer's weights into vLLM {version}; tried: " + "; ".join(errors))


class VLLMEngine:
    """The `Engine` protocol on a vLLM `LLM` in this process (colocated with the trainer):
    `gpu_memory_utilization` is vLLM's share of the GPU (weights and KV cache), the rest is
    the trainer's. Prompts go in as token ids and come back as token ids; nothing is re-tokenised."""

    def __init__(self, model_dir: str, tokenizer, *, gpu_memory_utilization: float = 0.3, dtype: str = "auto",
                 seed: int = 0, enable_lora: bool = False, max_lora_rank: int = 64, max_model_len: int | None = None,
                 enforce_eager: bool = False, trust_remote_code: bool = False, eos_ids: Sequence[int] | None = None):
        # V1 runs its engine core in a subprocess by default; in this process the model is reachable
        # for weight loading without serialising tensors
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        import vllm

        self._vllm, self.version = vllm, getattr(vllm, "__version__", "unknown")
        eos = eos_ids or tokenizer.eos_token_id  # `eos_ids`: every token that ends a completion
        self.eos_ids = sorted(set(eos) if isinstance(eos, (list, tuple)) else {eos})
        self.enable_lora = enable_lora
        self._lora, self._lora_dirs, self._syncs = None, [], 0
        kwargs = dict(model=str(model_dir), dtype=dtype, seed=seed, gpu_memory_utilization=gpu_memory_utilization,
                      enable_prefix_caching=True, skip_tokenizer_init=True, enforce_eager=enforce_eager,
                      max_model_len=max_model_len, enable_lora=enable_lora, trust_remote_code=trust_remote_code)
        if enable_lora:
            kwargs["max_lora_rank"] = max_lora_rank
        self.processed_logprobs = True
        try:
            # behaviour log-probs after temperature, as the trainer computes them (vLLM >= 0.10.2)
            self.llm = vllm.LLM(**kwargs, logprobs_mode="processed_logprobs")
        except TypeError as err:
            if "logprobs_mode" not in str(err):
                raise
            self.processed_logprobs = False
            self.llm = vllm.LLM(**kwargs)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 max_new_tokens: Sequence[int] | None = None) -> list[Sample]:
        caps = list(max_new_tokens) if max_new_tokens is not None else [params.max_new_tokens] * len(prompts)
        caps = [min(cap, params.max_new_tokens) for cap in caps]
        if not self.processed_logprobs and params.temperature not in (0, 1):
            warnings.warn(f"vLLM {self.version} returns log-probs before temperature; the behaviour log-probs at "
                          f"temperature {params.temperature} are not the sampler's (upgrade to vLLM >= 0.10.2)",
                          stacklevel=2)
        sampling = [self._vllm.SamplingParams(**vllm_sampling_kwargs(params, cap, self.eos_ids)) for cap in caps]
        outputs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], sampling_params=sampling,
                                    use_tqdm=False, lora_request=self._lora)
        return samples_from_outputs(outputs, set(self.eos_ids), caps)

    def score(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> list[float]:
        """Log-probs (temperature 1) of `completion_ids` after `prompt_ids`, from vLLM's prompt log-probs."""
        ids = [*prompt_ids, *completion_ids]
        sampling = self._vllm.SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=1, detokenize=False)
        output = self.llm.generate([{"prompt_token_ids": ids}], sampling_params=sampling, use_tqdm=False,
                                   lora_request=self._lora)[0]
        return prompt_token_logprobs(output.prompt_logprobs, ids, len(prompt_ids))

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Full weights into the running model, or for a PEFT model its adapter as a new LoRA
        request; then the prefix cache is reset, since its KV blocks came from the old weights."""
        self._syncs += 1
        if is_peft_model(model):
            self._sync_adapter(model)
        else:
            load_full_weights(self.llm, lambda: hf_weight_items(model), self.version)
        self.llm.reset_prefix_cache()

    def _sync_adapter(self, model: torch.nn.Module) -> None:
        if not self.enable_lora:
            raise ValueError("the policy is a PEFT (LoRA) model: build the vLLM engine with enable_lora=True")
        from vllm.lora.request import LoRARequest

        path = tempfile.mkdtemp(prefix="lmpo-lora-")
        model.save_pretrained(path)
        # a new id makes vLLM load the new adapter instead of serving its cached one
        self._lora = LoRARequest(f"policy-{self._syncs}", self._syncs, path)
        self._lora_dirs.append(path)
        while len(self._lora_dirs) > 2:  # the previous adapter may still be loading
            shutil.rmtree(self._lora_dirs.pop(0), ignore_errors=True)

    def close(self) -> None:
        """Free vLLM's GPU memory and the saved adapters."""
        for path in self._lora_dirs:
            shutil.rmtree(path, ignore_errors=True)
        self._lora_dirs = []
        del self.llm
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

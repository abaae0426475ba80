"""Incremental decoders: prefill a left-padded prompt batch, then one token per step.

`FastLlamaDecoder` is a lean re-implementation of the Llama/Qwen2/Mistral forward pass for
decoding, reading the weights of the transformers model in place: a preallocated KV cache,
fused QKV and gate/up projections, and on CPU the compiled kernels of `lmpo.rollout.kernels`
for everything between the matmuls. On small models the per-step overhead of the generic path
dominates, which is why this path exists (see `bench/rollout_speed.py`). `HFDecoder` works for
any transformers causal LM. Both are checked against a teacher-forced forward pass of the
model in the tests.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import DynamicCache, PreTrainedModel

from lmpo.models.logprobs import positions_from_mask
from lmpo.rollout import kernels

FAST_MODEL_TYPES = {"llama", "qwen2", "mistral"}


# RoPE variants whose cos/sin the model's own rotary embedding computes once for all positions
STATIC_ROPE_TYPES = {"default", "linear", "llama3"}

# Prepacking a weight for oneDNN (`_linear`) costs about as much as multiplying by it for 2 to 30
# decoding steps of 64 rows, and pays back less per step the smaller the model: measured on a
# 2-core EPYC, hidden size 128 broke even at ~27 steps, 256 at 3 to 7, 512 at ~2. So it is done
# only from `max_new_tokens * hidden_size**2` of this on (none for the sort task's 12 tokens at 128).
PACK_FROM_WORK = 32 * 128 ** 2


def fast_path_supported(model: torch.nn.Module) -> bool:
    """The fast decoder implements exactly: Llama/Qwen2/Mistral causal LMs with SiLU-gated MLPs
    without biases, q/k/v biases all present or all absent, an optional o_proj bias, RMSNorm,
    full attention in every layer and a static RoPE. Anything else (an MLP bias, another
    activation, sliding windows, dynamic RoPE scaling, ...) goes through Hugging Face's forward."""
    return not fast_path_refusal(model)


def fast_path_refusal(model: torch.nn.Module) -> str:
    """Why the fast decoder would not be exact for `model` ("" when it would)."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "model_type", None) not in FAST_MODEL_TYPES:
        return f"model type {getattr(config, 'model_type', None)!r} is not one of {sorted(FAST_MODEL_TYPES)}"
    if not type(model).__name__.endswith("ForCausalLM"):
        return f"{type(model).__name__} is not a causal LM class"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act={config.hidden_act!r}"
    if getattr(config, "use_sliding_window", False) or (config.model_type == "mistral" and getattr(config, "sliding_window", None)):
        return "sliding-window attention"
    if any(t != "full_attention" for t in getattr(config, "layer_types", None) or []):
        return "layers that are not full attention"
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if rope_type not in STATIC_ROPE_TYPES:
        return f"RoPE type {rope_type!r}"
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "rotary_emb"):
        return "no decoder layers or rotary embedding where Llama-family models keep them"
    for i, layer in enumerate(inner.layers):
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        projections = [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
        if attn is None or any(p is None for p in projections):
            return f"layer {i} is not a Llama-family layer"
        if any(p.bias is not None for p in projections):
            return f"layer {i} has MLP biases"
        qkv_biases = {getattr(attn, n).bias is not None for n in ("q_proj", "k_proj", "v_proj")}
        if len(qkv_biases) > 1:
            return f"layer {i} has biases on some of q/k/v only"
        norms = (layer.input_layernorm, layer.post_attention_layernorm)
        if any(not hasattr(n, "variance_epsilon") or getattr(n, "bias", None) is not None for n in norms):
            return f"layer {i} has a norm other than RMSNorm"
    return ""


class HFDecoder:
    """Generic incremental decoding through the model's own forward and a `DynamicCache`."""

    def __init__(self, model: PreTrainedModel):
        self.model = model

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        self.cache = DynamicCache(config=self.model.config)
        self.mask = attention_mask
        self.next_pos = attention_mask.long().sum(dim=1)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         position_ids=positions_from_mask(attention_mask), cache=self.cache,
                         use_cache=True, logits_to_keep=1)
        return out.logits[:, -1]

    def keep(self, rows: torch.Tensor) -> None:
        """Drop every batch row not in `rows` (finished sequences)."""
        self.cache.batch_select_indices(rows)
        self.mask, self.next_pos = self.mask[rows], self.next_pos[rows]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=1)
        out = self.model(input_ids=tokens[:, None], attention_mask=self.mask,
                         position_ids=self.next_pos[:, None], cache=self.cache, use_cache=True)
        self.next_pos = self.next_pos + 1
        return out.logits[:, -1]


class FastLlamaDecoder:
    """Lean decoding for Llama-family models (RMSNorm, RoPE, SwiGLU, optional QKV bias).

    Each RMSNorm's gain is folded into the projection that follows it, q/k/v and gate/up are
    each one matmul, and the residual additions are fused into the output and down projections.
    On CPU in fp32 a decoding step runs the compiled kernels of `lmpo.rollout.kernels`
    (RMSNorm, SwiGLU, and RoPE + cache write + attention, one call each); elsewhere, and for the
    prompt (prefill), the same computation runs as PyTorch operations.
    """

    def __init__(self, model: PreTrainedModel):
        cfg = model.config
        inner = model.model
        self.embed = inner.embed_tokens.weight
        self.rotary = inner.rotary_emb
        self.final_eps = inner.norm.variance_epsilon
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.q_width = self.n_heads * self.head_dim
        self.rope_width = (self.n_heads + self.n_kv) * self.head_dim  # q and k: the rotated columns
        on_cpu_fp32 = self.embed.device.type == "cpu" and self.embed.dtype == torch.float32
        supported = on_cpu_fp32 and self.head_dim % kernels.KEY_BLOCK == 0
        self.kernels = kernels.load() if supported else None
        self.model = model

    def _projections(self, pack: bool) -> None:
        inner = self.model.model
        with torch.no_grad():
            self.lm_head = _linear(self.model.lm_head.weight * inner.norm.weight, None, pack=pack)
            self.layers = [self._layer_weights(layer, pack) for layer in inner.layers]

    def _layer_weights(self, layer, pack: bool) -> dict:
        attn, mlp = layer.self_attn, layer.mlp
        ln1, ln2 = layer.input_layernorm, layer.post_attention_layernorm
        qkv_b = None
        if attn.q_proj.bias is not None:
            qkv_b = torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias])
        return {
            "eps1": ln1.variance_epsilon, "eps2": ln2.variance_epsilon,
            "qkv": _linear(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]) * ln1.weight,
                           qkv_b, pack=pack),
            "o_residual": _linear(attn.o_proj.weight, attn.o_proj.bias, residual=True, pack=pack),
            "gate_up": _linear(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]) * ln2.weight, None, pack=pack),
            "down_residual": _linear(mlp.down_proj.weight, None, residual=True, pack=pack),
        }

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        batch, prompt_len = input_ids.shape
        self._projections(pack=max_new_tokens * self.embed.size(1) ** 2 >= PACK_FROM_WORK)
        # the kernel scores keys in blocks of 16: a cache length that is a multiple of 16 keeps every
        # block inside the cache (positions not yet written are masked by -inf)
        total = -(-(prompt_len + max_new_tokens) // kernels.KEY_BLOCK) * kernels.KEY_BLOCK
        device, dtype = input_ids.device, self.embed.dtype
        # cache rows are (sequence, kv-head) pairs so that decoding attention is one batched matmul;
        # keys are stored transposed [d, T], the layout of q @ K^T (the kernels' blocked layout
        # after the prompt)
        rows = (len(self.layers), batch * self.n_kv)
        self.k_cache = torch.zeros(*rows, self.head_dim, total, dtype=dtype, device=device)
        self.v_cache = torch.zeros(*rows, total, self.head_dim, dtype=dtype, device=device)
        # additive attention bias per cache row [B*kv, 1, total]: 0 for keys that may be seen
        self.key_bias = torch.full((batch, total), float("-inf"), dtype=dtype, device=device)
        self.key_bias[:, :prompt_len].masked_fill_(attention_mask.bool(), 0.0)
        self.key_bias = self.key_bias.repeat_interleave(self.n_kv, dim=0)[:, None]
        self.length = 0
        self.next_pos = attention_mask.long().sum(dim=1)
        cos, sin = self.rotary(self.embed[:1][None], torch.arange(total, device=device)[None])
        self.cos, self.sin = cos[0].to(dtype).contiguous(), sin[0].to(dtype).contiguous()  # [total, head_dim]
        causal = torch.ones(prompt_len, prompt_len, dtype=torch.bool, device=device).tril()
        # a padding query may see only itself, so that no attention row is empty (NaN)
        allowed = (causal[None] & attention_mask.bool()[:, None, :]) | torch.eye(prompt_len, dtype=torch.bool, device=device)
        bias = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, float("-inf"))
        # rows (sequence, kv head); the query heads sharing a kv head are stacked along the query axis
        bias = bias.repeat_interleave(self.n_kv, dim=0).repeat(1, self.n_heads // self.n_kv, 1)
        hidden = self._forward(input_ids, positions_from_mask(attention_mask), bias)
        if self.kernels is not None:
            self.k_cache = kernels.blocked_keys(self.k_cache)
        return self._logits(hidden[:, -1])

    def keep(self, rows: torch.Tensor) -> None:
        """Drop every batch row not in `rows` (finished sequences)."""
        cache_rows = (rows[:, None] * self.n_kv + torch.arange(self.n_kv, device=rows.device)).flatten()
        # index_select, not indexing: ~3x faster on CPU for these copies of the whole cache
        self.k_cache = self.k_cache.index_select(1, cache_rows)
        self.v_cache = self.v_cache.index_select(1, cache_rows)
        self.key_bias, self.next_pos = self.key_bias.index_select(0, cache_rows), self.next_pos.index_select(0, rows)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.key_bias[:, :, self.length] = 0.0
        if self.kernels is not None:
            hidden = self._kernel_step(tokens)
        else:
            bias = self.key_bias[:, :, : self.length + 1]  # shared by every layer and query head
            hidden = self._forward(tokens[:, None], self.next_pos[:, None], bias)[:, -1]
        self.next_pos = self.next_pos + 1
        return self._logits(hidden)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.kernels is not None:
            return self.lm_head(self.kernels.rms_norm(hidden.contiguous(), self.final_eps, torch.get_num_threads()))
        return self.lm_head(_rms_norm(hidden, self.final_eps))

    def _kernel_step(self, tokens: torch.Tensor) -> torch.Tensor:
        """One token per sequence through the compiled kernels: hidden state [B, hidden]."""
        kern, rope, threads = self.kernels, self.rope_width, torch.get_num_threads()
        x = F.embedding(tokens, self.embed)
        for i, w in enumerate(self.layers):
            qkv = w["qkv"](kern.rms_norm(x, w["eps1"], threads))
            attn = kern.decode_attention(qkv, self.q_width, rope, self.next_pos, self.cos, self.sin,
                                         self.k_cache[i], self.v_cache[i], self.key_bias, self.length,
                                         self.n_heads, self.n_kv, threads=threads)
            x = w["o_residual"](attn, x)
            x = w["down_residual"](kern.silu_mul(w["gate_up"](kern.rms_norm(x, w["eps2"], threads)), threads), x)
        self.length += 1
        return x

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """`bias` [B*kv, group*seq or 1, S]: 0 where a query may attend to a key, -inf elsewhere."""
        batch, seq = ids.shape
        start, end = self.length, self.length + seq
        heads, kv, dim = self.n_heads, self.n_kv, self.head_dim
        group, q_width, rope, half = heads // kv, self.q_width, self.rope_width, dim // 2
        x = F.embedding(ids, self.embed)
        cos, sin = self.cos[positions][:, :, None], self.sin[positions][:, :, None]  # [B, seq, 1, dim]
        scale = dim ** -0.5
        for i, w in enumerate(self.layers):
            qkv = w["qkv"](_rms_norm(x, w["eps1"]))
            qk = qkv[..., :rope].view(batch, seq, heads + kv, dim)
            rotated = torch.cat([-qk[..., half:], qk[..., :half]], dim=-1)  # transformers' rotate_half
            qk = torch.addcmul(qk * cos, rotated, sin)
            keys, values = self.k_cache[i], self.v_cache[i]
            keys.view(batch, kv, dim, -1)[..., start:end] = qk[:, :, heads:].permute(0, 2, 3, 1)
            values.view(batch, kv, -1, dim)[:, :, start:end] = qkv[..., rope:].view(batch, seq, kv, dim).transpose(1, 2)
            q = qk[:, :, :heads].transpose(1, 2).reshape(batch * kv, group * seq, dim)
            scores = torch.baddbmm(bias, q, keys[..., :end], alpha=scale)
            attn = torch.bmm(torch.softmax(scores, dim=-1), values[:, :end])  # [B*kv, group*seq, dim]
            attn = attn.view(batch, heads, seq, dim).transpose(1, 2).reshape(batch, seq, q_width)
            x = w["o_residual"](attn, x)
            gate, up = w["gate_up"](_rms_norm(x, w["eps2"])).chunk(2, dim=-1)
            x = w["down_residual"](F.silu(gate).mul_(up), x)
        self.length = end
        return x


def _rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm without its gain (folded into the next projection), in fp32 as transformers does."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, x.shape[-1:], None, eps)
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _linear(weight: torch.Tensor, bias: torch.Tensor | None, residual: bool = False, pack: bool = True):
    """`x -> x @ weight.T + bias`, or with `residual` `(x, r) -> x @ weight.T + bias + r`; on CPU in
    fp32, with the weight prepacked for oneDNN once per decoder, which multiplies small batches
    faster than repacking on every call, and the residual addition fused into the matmul."""
    weight = weight.detach()
    bias = None if bias is None else bias.detach()
    if pack and weight.device.type == "cpu" and weight.dtype == torch.float32 and _ONEDNN_LINEAR:
        try:
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, 64)
            if residual:
                return lambda x, r: torch.ops.mkldnn._linear_pointwise.binary(x, r, packed, bias, "add")
            return lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
        except RuntimeError:
            pass
    if residual:
        return lambda x, r: F.linear(x, weight, bias).add_(r)
    return lambda x: F.linear(x, weight, bias)


def _onednn_linear_works() -> bool:
    """The packed path uses private oneDNN ops: use it only where it exists and agrees with F.linear."""
    try:
        gen = torch.Generator().manual_seed(0)
        weight, x = torch.randn(24, 16, generator=gen), torch.randn(3, 16, generator=gen)
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, 3)
        out = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
        summed = torch.ops.mkldnn._linear_pointwise.binary(x, out, packed, None, "add")
        return torch.backends.mkldnn.is_available() and torch.allclose(out, F.linear(x, weight), atol=1e-5) \
            and torch.allclose(summed, 2 * out, atol=1e-5)
    except (AttributeError, RuntimeError):
        return False


_ONEDNN_LINEAR = _onednn_linear_works()

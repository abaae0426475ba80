"""Incremental decoders: prefill a left-padded prompt batch, then one token per step.

`FastLlamaDecoder` is a lean re-implementation of the Llama/Qwen2/Mistral forward pass for
decoding, reading the weights of the transformers model in place: a preallocated KV cache,
fused QKV and gate/up projections and no per-step framework bookkeeping. On small models the
per-step overhead of the generic path dominates, which is why this path exists (see
`bench/rollout_speed.py`). `HFDecoder` works for any transformers causal LM.
Both are checked against a teacher-forced forward pass of the model in the tests.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import DynamicCache, PreTrainedModel

from lmpo.models.logprobs import positions_from_mask

FAST_MODEL_TYPES = {"llama", "qwen2", "mistral"}


def fast_path_supported(model: torch.nn.Module) -> bool:
    config = getattr(model, "config", None)
    if config is None or getattr(config, "model_type", None) not in FAST_MODEL_TYPES:
        return False
    if getattr(config, "hidden_act", "silu") != "silu" or getattr(config, "use_sliding_window", False):
        return False
    if getattr(config, "sliding_window", None) and config.model_type == "mistral":
        return False
    inner = getattr(model, "model", None)
    return inner is not None and hasattr(inner, "layers") and hasattr(inner, "rotary_emb") \
        and type(model).__name__.endswith("ForCausalLM")


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
    """Lean decoding for Llama-family models (RMSNorm, RoPE, SwiGLU, optional QKV bias)."""

    def __init__(self, model: PreTrainedModel):
        cfg = model.config
        self.model = model
        inner = model.model
        self.embed = inner.embed_tokens.weight
        self.rotary = inner.rotary_emb
        self.final_norm = (inner.norm.weight, inner.norm.variance_epsilon)
        self.lm_head = model.lm_head.weight
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.layers = [self._layer_weights(layer) for layer in inner.layers]

    @staticmethod
    def _layer_weights(layer) -> dict:
        attn, mlp = layer.self_attn, layer.mlp
        qkv_w = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
        qkv_b = None
        if attn.q_proj.bias is not None:
            qkv_b = torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias])
        return {
            "ln1": (layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon),
            "ln2": (layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon),
            "qkv_w": qkv_w, "qkv_b": qkv_b,
            "o_w": attn.o_proj.weight, "o_b": attn.o_proj.bias,
            "gate_up_w": torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]),
            "down_w": mlp.down_proj.weight,
        }

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        batch, prompt_len = input_ids.shape
        total = prompt_len + max_new_tokens
        device, dtype = input_ids.device, self.embed.dtype
        # cache rows are (sequence, kv-head) pairs so that decoding attention is one batched matmul
        shape = (len(self.layers), batch * self.n_kv, total, self.head_dim)
        self.k_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.v_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.key_bias = torch.full((batch, total), float("-inf"), dtype=dtype, device=device)
        self.key_bias[:, :prompt_len].masked_fill_(attention_mask.bool(), 0.0)
        self.batch, self.length = batch, 0
        self.next_pos = attention_mask.long().sum(dim=1)
        positions = torch.arange(total, device=device)[None]
        cos, sin = self.rotary(self.embed[:1][None], positions)
        self.cos_table, self.sin_table = cos[0], sin[0]  # [total, head_dim]
        causal = torch.ones(prompt_len, prompt_len, dtype=torch.bool, device=device).tril()
        # a padding query may see only itself, so that no attention row is empty (NaN)
        allowed = (causal[None] & attention_mask.bool()[:, None, :]) | torch.eye(prompt_len, dtype=torch.bool, device=device)
        bias = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, float("-inf"))
        hidden = self._forward(input_ids, positions_from_mask(attention_mask), bias)
        return self._logits(hidden[:, -1])

    def keep(self, rows: torch.Tensor) -> None:
        """Drop every batch row not in `rows` (finished sequences)."""
        cache_rows = (rows[:, None] * self.n_kv + torch.arange(self.n_kv, device=rows.device)).flatten()
        self.k_cache = self.k_cache[:, cache_rows]
        self.v_cache = self.v_cache[:, cache_rows]
        self.key_bias, self.next_pos = self.key_bias[rows], self.next_pos[rows]
        self.batch = len(rows)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.key_bias[:, self.length] = 0.0
        bias = self.key_bias[:, None, : self.length + 1]  # [B, 1, S]: shared by every layer
        hidden = self._forward(tokens[:, None], self.next_pos[:, None], bias)
        self.next_pos = self.next_pos + 1
        return self._logits(hidden[:, -1])

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        weight, eps = self.final_norm
        return F.linear(_rms_norm(hidden, weight, eps), self.lm_head)

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """`bias` [B, q, S]: 0 where a query may attend to a key, -inf elsewhere."""
        batch, seq = ids.shape
        start, end = self.length, self.length + seq
        heads, kv, dim = self.n_heads, self.n_kv, self.head_dim
        group = heads // kv
        x = F.embedding(ids, self.embed)
        cos, sin = self.cos_table[positions][:, None], self.sin_table[positions][:, None]  # [B, 1, seq, dim]
        # [B*kv, group*seq, S]: the query heads that share a kv head are stacked along the query axis
        bias = bias.repeat_interleave(kv, dim=0).repeat(1, group, 1)
        scale = dim ** -0.5
        for i, w in enumerate(self.layers):
            h = _rms_norm(x, *w["ln1"])
            qkv = F.linear(h, w["qkv_w"], w["qkv_b"])
            q, k, v = qkv.split([heads * dim, kv * dim, kv * dim], dim=-1)
            q = q.view(batch, seq, heads, dim).transpose(1, 2)
            k = k.view(batch, seq, kv, dim).transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            keys, values = self.k_cache[i], self.v_cache[i]
            keys.view(batch, kv, -1, dim)[:, :, start:end] = k
            values.view(batch, kv, -1, dim)[:, :, start:end] = v.view(batch, seq, kv, dim).transpose(1, 2)
            q = q.reshape(batch * kv, group * seq, dim)
            scores = torch.baddbmm(bias, q, keys[:, :end].transpose(1, 2), alpha=scale)
            attn = torch.bmm(torch.softmax(scores, dim=-1), values[:, :end])  # [B*kv, group*seq, dim]
            attn = attn.view(batch, heads, seq, dim).transpose(1, 2).reshape(batch, seq, heads * dim)
            x = x + F.linear(attn, w["o_w"], w["o_b"])
            gate, up = F.linear(_rms_norm(x, *w["ln2"]), w["gate_up_w"]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, w["down_w"])
        self.length = end
        return x


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

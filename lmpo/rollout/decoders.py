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
    """Lean decoding for Llama-family models (RMSNorm, RoPE, SwiGLU, optional QKV bias).

    Rotary embeddings are applied as one complex multiplication: the query and key rows of the
    fused QKV weight are permuted within each head so that the pairs (i, i + d/2) that RoPE
    rotates together are adjacent. Queries and keys get the same permutation, so attention
    scores are unchanged; the permuted keys never leave the decoder.
    """

    def __init__(self, model: PreTrainedModel):
        cfg = model.config
        inner = model.model
        self.embed = inner.embed_tokens.weight
        self.rotary = inner.rotary_emb
        self.final_eps = inner.norm.variance_epsilon
        with torch.no_grad():
            self.lm_head = _linear(model.lm_head.weight * inner.norm.weight, None)
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        half = self.head_dim // 2
        self.pair_order = torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).flatten()
        with torch.no_grad():
            self.layers = [self._layer_weights(layer) for layer in inner.layers]

    def _rope_rows(self, weight: torch.Tensor | None, heads: int) -> torch.Tensor | None:
        if weight is None:
            return None
        shaped = weight.view(heads, self.head_dim, *weight.shape[1:])
        return shaped[:, self.pair_order.to(weight.device)].reshape(weight.shape)

    def _layer_weights(self, layer) -> dict:
        attn, mlp = layer.self_attn, layer.mlp
        ln1, ln2 = layer.input_layernorm, layer.post_attention_layernorm
        q_w, k_w = self._rope_rows(attn.q_proj.weight, self.n_heads), self._rope_rows(attn.k_proj.weight, self.n_kv)
        qkv_b = None
        if attn.q_proj.bias is not None:
            qkv_b = torch.cat([self._rope_rows(attn.q_proj.bias, self.n_heads),
                               self._rope_rows(attn.k_proj.bias, self.n_kv), attn.v_proj.bias])
        # each RMSNorm's gain is folded into the projection that follows it
        return {
            "eps1": ln1.variance_epsilon, "eps2": ln2.variance_epsilon,
            "qkv": _linear(torch.cat([q_w, k_w, attn.v_proj.weight]) * ln1.weight, qkv_b),
            "o": _linear(attn.o_proj.weight, attn.o_proj.bias),
            "gate_up": _linear(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]) * ln2.weight, None),
            "down": _linear(mlp.down_proj.weight, None),
        }

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        batch, prompt_len = input_ids.shape
        total = prompt_len + max_new_tokens
        device, dtype = input_ids.device, self.embed.dtype
        # cache rows are (sequence, kv-head) pairs so that decoding attention is one batched matmul
        shape = (len(self.layers), batch * self.n_kv, total, self.head_dim)
        self.k_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.v_cache = torch.zeros(shape, dtype=dtype, device=device)
        # additive attention bias per cache row [B*kv, 1, total]: 0 for keys that may be seen
        self.key_bias = torch.full((batch, total), float("-inf"), dtype=dtype, device=device)
        self.key_bias[:, :prompt_len].masked_fill_(attention_mask.bool(), 0.0)
        self.key_bias = self.key_bias.repeat_interleave(self.n_kv, dim=0)[:, None]
        self.length = 0
        self.next_pos = attention_mask.long().sum(dim=1)
        cos, sin = self.rotary(self.embed[:1][None], torch.arange(total, device=device)[None])
        half = self.head_dim // 2
        self.rotation = torch.complex(cos[0, :, :half].float(), sin[0, :, :half].float())  # [total, d/2]
        causal = torch.ones(prompt_len, prompt_len, dtype=torch.bool, device=device).tril()
        # a padding query may see only itself, so that no attention row is empty (NaN)
        allowed = (causal[None] & attention_mask.bool()[:, None, :]) | torch.eye(prompt_len, dtype=torch.bool, device=device)
        bias = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, float("-inf"))
        # rows (sequence, kv head); the query heads sharing a kv head are stacked along the query axis
        bias = bias.repeat_interleave(self.n_kv, dim=0).repeat(1, self.n_heads // self.n_kv, 1)
        hidden = self._forward(input_ids, positions_from_mask(attention_mask), bias)
        return self._logits(hidden[:, -1])

    def keep(self, rows: torch.Tensor) -> None:
        """Drop every batch row not in `rows` (finished sequences)."""
        cache_rows = (rows[:, None] * self.n_kv + torch.arange(self.n_kv, device=rows.device)).flatten()
        self.k_cache = self.k_cache[:, cache_rows]
        self.v_cache = self.v_cache[:, cache_rows]
        self.key_bias, self.next_pos = self.key_bias[cache_rows], self.next_pos[rows]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.key_bias[:, :, self.length] = 0.0
        bias = self.key_bias[:, :, : self.length + 1]  # shared by every layer and query head
        hidden = self._forward(tokens[:, None], self.next_pos[:, None], bias)
        self.next_pos = self.next_pos + 1
        return self._logits(hidden[:, -1])

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(_rms_norm(hidden, self.final_eps))

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """`bias` [B*kv, group*seq or 1, S]: 0 where a query may attend to a key, -inf elsewhere."""
        batch, seq = ids.shape
        start, end = self.length, self.length + seq
        heads, kv, dim = self.n_heads, self.n_kv, self.head_dim
        group, rotated = heads // kv, (heads + kv) * dim
        x = F.embedding(ids, self.embed)
        rotation = self.rotation[positions][:, :, None]  # [B, seq, 1, d/2]
        scale = dim ** -0.5
        for i, w in enumerate(self.layers):
            qkv = w["qkv"](_rms_norm(x, w["eps1"]))
            pairs = torch.view_as_complex(qkv[..., :rotated].float().reshape(batch, seq, heads + kv, dim // 2, 2))
            qk = torch.view_as_real(pairs * rotation).to(x.dtype).view(batch, seq, heads + kv, dim)
            keys, values = self.k_cache[i], self.v_cache[i]
            keys.view(batch, kv, -1, dim)[:, :, start:end] = qk[:, :, heads:].transpose(1, 2)
            values.view(batch, kv, -1, dim)[:, :, start:end] = qkv[..., rotated:].view(batch, seq, kv, dim).transpose(1, 2)
            q = qk[:, :, :heads].transpose(1, 2).reshape(batch * kv, group * seq, dim)
            scores = torch.baddbmm(bias, q, keys[:, :end].transpose(1, 2), alpha=scale)
            attn = torch.bmm(torch.softmax(scores, dim=-1), values[:, :end])  # [B*kv, group*seq, dim]
            attn = attn.view(batch, heads, seq, dim).transpose(1, 2).reshape(batch, seq, heads * dim)
            x = x + w["o"](attn)
            gate, up = w["gate_up"](_rms_norm(x, w["eps2"])).chunk(2, dim=-1)
            x.add_(w["down"](F.silu(gate).mul_(up)))
        self.length = end
        return x


def _rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm without its gain (folded into the next projection), in fp32 as transformers does."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, x.shape[-1:], None, eps)
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _linear(weight: torch.Tensor, bias: torch.Tensor | None):
    """`x -> x @ weight.T + bias`; on CPU in fp32, with the weight prepacked for oneDNN once per
    decoder, which multiplies small batches faster than repacking on every call."""
    weight = weight.detach()
    bias = None if bias is None else bias.detach()
    if weight.device.type == "cpu" and weight.dtype == torch.float32 and _ONEDNN_LINEAR:
        try:
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, 64)
            return lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
        except RuntimeError:
            pass
    return lambda x: F.linear(x, weight, bias)


def _onednn_linear_works() -> bool:
    """The packed path uses private oneDNN ops: use it only where it exists and agrees with F.linear."""
    try:
        gen = torch.Generator().manual_seed(0)
        weight, x = torch.randn(24, 16, generator=gen), torch.randn(3, 16, generator=gen)
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, 3)
        out = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
        return torch.backends.mkldnn.is_available() and torch.allclose(out, F.linear(x, weight), atol=1e-5)
    except (AttributeError, RuntimeError):
        return False


_ONEDNN_LINEAR = _onednn_linear_works()

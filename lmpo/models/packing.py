"""Padding-free forwards: a batch's sequences (real prompt tokens, then the completion up to its
last scored token) laid end to end in a few rows, positions restarting at each sequence, and
attention kept within each sequence by an explicit block-diagonal causal mask. The model then
computes nothing for padding, and the output head runs only on the tokens that are scored.
Rows that share a prompt (a GRPO group, a preference pair) can hold it once: each completion
then attends to the one copy and to its own earlier tokens, so the prompt's work is done once
per group instead of once per completion (its gradient is the sum over the completions, as
before).

Rows are filled first-fit, largest unit first, up to `row_tokens` (at least the largest unit). The numbers equal the padded forward's to float tolerance (the same sums in
another order); `choose_layout` picks padded, packed or shared and the row length by a rough
cost model, since a dense mask costs attention work that causal attention on a padded batch
does not."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from itertools import chain

import torch

from lmpo.models.segments import (SegmentPlan, attention_pairs, bucket_segments, cpu_autocast, long_tensor, plan_segments,
                                  round_up, token_grain)


@dataclass
class PackedRows:
    """A batch packed into rows [R, N]. `groups` numbers each row's units (a prompt with the
    completions that follow it; padding gets its own negative id per position) and `branches`
    each unit's parts (0 for the prompt, k for its k-th completion). For each scored token,
    `predictor` is the flat index into [R * N] of the state that predicts it, `located` its own
    flat index there, `targets` its id and `scatter` its flat index into the batch's [B * T]
    completion grid. With `plan` (one row, attention by segments, see `segments`) the trunk
    attends by the plan and `groups`/`branches` only describe the row."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    groups: torch.Tensor
    branches: torch.Tensor
    predictor: torch.Tensor
    located: torch.Tensor
    targets: torch.Tensor
    scatter: torch.Tensor
    plan: SegmentPlan | None = None


@dataclass
class Unit:
    """A prompt and the batch rows whose completions (their first `lengths` tokens) follow it."""

    prompt: list[int]
    rows: list[int]
    lengths: list[int]

    @property
    def size(self) -> int:
        return len(self.prompt) + sum(self.lengths)


def can_pack_trunk(trunk: torch.nn.Module) -> bool:
    """A trunk that takes an explicit 4-D mask (eager or SDPA attention), in one process (a
    data-parallel wrapper must see the whole model's forward), whose packed forward gives each
    sequence what it gets alone (asked once per trunk, see `packing_checks`)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return False
    if getattr(getattr(trunk, "config", None), "_attn_implementation", None) not in ("sdpa", "eager"):
        return False
    return packing_checks(trunk)[0]


def can_segment_trunk(trunk: torch.nn.Module) -> bool:
    """A packable trunk whose every attention layer goes through transformers' SDPA entry, which
    lmpo's segment attention stands in for (see `segments`). Models with attention code of their
    own (Falcon's) load as SDPA too and ignore the plan; such a trunk packs rows under a mask."""
    return can_pack_trunk(trunk) and trunk.config._attn_implementation == "sdpa" and packing_checks(trunk)[1]


def packing_checks(trunk: torch.nn.Module) -> tuple[bool, bool]:
    """Whether the trunk, packed under a mask and by segments, gives a few short sequences (a
    prompt shared by a long and a short completion, then another prompt in the same row) the last
    hidden states each gets from a forward of its own, every attention layer running the segment
    plan. A model whose attention bias comes from a 2-D mask or from a token's place in the row
    (ALiBi: Bloom, MPT, Falcon with `alibi`) fails, and runs padded: MPT's log-probs with a shared
    prompt were 0.6 off, and Bloom's packed forward raised. Asked once per trunk and attention
    implementation, in eval mode, without a draw from the run's random streams."""
    asked = trunk.__dict__.setdefault("_lmpo_packing", {})  # by attention implementation: it may be switched
    implementation = trunk.config._attn_implementation
    if implementation not in asked:
        asked[implementation] = _check_packing(trunk)
    return asked[implementation]


def _check_packing(trunk: torch.nn.Module) -> tuple[bool, bool]:
    device = next(trunk.parameters()).device
    vocab = trunk.get_input_embeddings().num_embeddings
    ids = lambda span: [1 + i % (vocab - 1) for i in span]  # noqa: E731
    prompts = [ids(range(3)), ids(range(3)), ids(range(3, 5))]
    completions = [ids(range(5, 13)), ids(range(13, 16)), ids(range(16, 19))]  # 11 tokens at most: under a window
    as_tensor = lambda rows, width: torch.tensor([r + [0] * (width - len(r)) for r in rows], device=device)  # noqa: E731
    prompt_ids, completion_ids = as_tensor(prompts, 3), as_tensor(completions, 8)
    prompt_mask = as_tensor([[1] * len(p) for p in prompts], 3)
    lengths = torch.tensor([len(c) for c in completions], device=device)
    modes = [(m, m.training) for m in trunk.modules()]
    trunk.eval()
    try:
        with torch.no_grad(), torch.autocast(device.type, enabled=False), \
                torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            alone = [trunk(input_ids=torch.tensor([p + c], device=device), use_cache=False).last_hidden_state[0]
                     for p, c in zip(prompts, completions)]
            want = lambda packed: torch.stack([alone[b][len(prompts[b]) - 1 + t]  # noqa: E731
                                               for b, t in (divmod(int(f), 8) for f in packed.scatter)])
            tolerance = 1e-3 if alone[0].dtype == torch.float32 else 3e-2
            close = lambda got, wanted: bool((got - wanted).norm() <= tolerance * wanted.norm())  # noqa: E731
            packed = pack_completions(prompt_ids, prompt_mask, completion_ids, lengths, share_prompts=True)
            if not close(packed_states(trunk, packed), want(packed)):
                return False, False
            if trunk.config._attn_implementation != "sdpa":
                return True, False
            packed = pack_completions(prompt_ids, prompt_mask, completion_ids, lengths, segments=True)
            try:
                states, calls = _segment_calls(trunk, packed)
            except Exception:  # noqa: BLE001 -- e.g. a forward that takes no extra keyword (the plan rides in on one)
                return True, False
            states = states.reshape(-1, states.size(-1)).index_select(0, packed.predictor)
            return True, calls >= _attention_layers(trunk, packed.plan) and close(states, want(packed))
    except Exception:  # noqa: BLE001 -- a model that cannot take a packed row (Bloom's ALiBi) runs padded
        return False, False
    finally:
        for module, training in modes:
            module.training = training


def real_prompts(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> list[list[int]]:
    # two conversions to lists, not a masked index per row: this runs before every packed forward
    return [[t for t, m in zip(row, mask) if m] for row, mask in zip(prompt_ids.tolist(), prompt_mask.tolist())]


def units_of(prompts: list[list[int]], lengths: list[int], share_prompts: bool) -> list[Unit]:
    """One unit per row with a scored token, or, sharing prompts, one per distinct prompt (a
    GRPO group's completions, a preference pair's two answers): its tokens then run once."""
    units: dict = {}
    for b, (prompt, n) in enumerate(zip(prompts, lengths)):
        if n > 0:
            unit = units.setdefault(tuple(prompt) if share_prompts else b, Unit(prompt, [], []))
            unit.rows.append(b)
            unit.lengths.append(n)
    return list(units.values())


ROW_MULTIPLES = (1, 1.25, 1.5, 2, 3, 4)  # row lengths tried, in multiples of the largest unit


@dataclass
class Layout:
    """How a batch runs: `padded`, `packed` or `shared` (packed, each distinct prompt once,
    under a block-diagonal mask), in rows of `row_tokens` when packed; or `segments` (one row,
    each distinct prompt once, attention by segments)."""

    kind: str
    row_tokens: int = 0


def first_fit(sizes: list[int], capacity: int) -> list[list[int]]:
    """Indices of `sizes` per row: first fit, largest first, rows of `capacity` (>= every size)."""
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        slot = next((r for r, free in enumerate(room) if free >= sizes[i]), None)
        if slot is None:
            rows.append([])
            room.append(capacity)
            slot = len(rows) - 1
        rows[slot].append(i)
        room[slot] -= sizes[i]
    return rows


def forward_cost(slots: int, width: int, per_token: float, per_pair: float) -> float:
    """Rough cost of a forward over `slots` token positions (padding included) in rows of `width`:
    the weights' work per position plus attention's per pair of positions in a row (dense: a
    masked pair costs as much)."""
    return slots * per_token + slots * width * per_pair


def choose_layout(prompts: list[list[int]], lengths: list[int], per_token: float, per_pair: float,
                  per_bucket: float | None = None) -> Layout:
    """The trimmed padded batch (causal attention: half the pairs), packed rows with or without
    shared prompts in rows of 1 to 4 times the largest unit, or (given `per_bucket`, the fixed
    cost of one bucket's attention in all layers) one row attended by segments: whichever
    `forward_cost` finds cheapest (wider rows can leave less padding but cost more attention)."""
    # an RL step costs the same batch for its reference, old and update forwards: remembered
    return _cheapest_layout(tuple(map(tuple, prompts)), tuple(lengths), per_token, per_pair, per_bucket)


SEGMENT_OVERHEAD = 0.05  # gathering queries and keys by segment, per token, as a share of its weights' work
BUCKET_FLOPS = 3e7  # one bucket's attention call in one layer, forward, as FLOPs (measured on CPU: ~0.2 ms)


@functools.lru_cache(maxsize=32)
def _cheapest_layout(prompts: tuple[tuple[int, ...], ...], lengths: tuple[int, ...], per_token: float,
                     per_pair: float, per_bucket: float | None) -> Layout:
    width = max(len(p) for p in prompts) + max(lengths)
    best, best_cost = Layout("padded"), forward_cost(len(prompts) * width, width, per_token, per_pair / 2)
    # with segments at hand, rows wider than a unit lose to them: a dense mask's waste grows with the width
    multiples = (1,) if per_bucket is not None else ROW_MULTIPLES
    units = {kind: units_of(prompts, lengths, kind == "shared") for kind in ("packed", "shared")}
    for kind in ("packed", "shared"):
        sizes = [u.size for u in units[kind]]
        for row_tokens in sorted({int(max(sizes) * k) for k in multiples} if sizes else []):
            slots = len(first_fit(sizes, row_tokens)) * row_tokens
            cost = forward_cost(slots, row_tokens, per_token, per_pair)
            if cost < best_cost:
                best, best_cost = Layout(kind, row_tokens), cost
    if per_bucket is not None:
        shared = units["shared"]
        tokens = sum(u.size for u in shared)
        segments = [(0, len(u.prompt)) for u in shared] + [(len(u.prompt), n) for u in shared for n in u.lengths]
        cost = (tokens * per_token * (1 + SEGMENT_OVERHEAD) + attention_pairs(segments) * per_pair
                + len(bucket_segments([own for _, own in segments])) * per_bucket)
        if cost < best_cost:
            best = Layout("segments", tokens)
    return best


def attention_span(config) -> int | None:
    """How far back a layer of this model may attend: None when every layer sees the whole
    sequence, a sliding window's width (Mistral, Gemma 2 and 3, Qwen2 with `use_sliding_window`),
    or 0 for other kinds of layer (chunked, linear attention). A packed forward applies its own
    mask, without the window, so it is exact only for sequences shorter than that width."""
    window = getattr(config, "sliding_window", None)
    window = window if isinstance(window, int) and window > 0 else None
    kinds = set(getattr(config, "layer_types", None) or [])
    if kinds:
        limited = kinds - {"full_attention"}
        if not limited:
            return None
        return window if limited == {"sliding_attention"} and window else 0
    return None if getattr(config, "use_sliding_window", True) is False else window


def trunk_layout(trunk: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                 lengths: torch.Tensor) -> Layout:
    """`choose_layout` for a batch, costed from the trunk's shapes (padded when nothing is scored,
    or when a sequence is as long as the model's attention window, see `attention_span`)."""
    if not bool((lengths > 0).any()):
        return Layout("padded")
    config = trunk.config
    prompts = real_prompts(prompt_ids, prompt_mask)
    span = attention_span(config)
    if span is not None and max(len(p) + n for p, n in zip(prompts, lengths.tolist())) >= span:
        return Layout("padded")
    hidden, layers = config.hidden_size, config.num_hidden_layers
    inner = getattr(config, "intermediate_size", None) or 4 * hidden
    per_token = 2 * layers * (4 * hidden * hidden + 3 * hidden * inner)
    return choose_layout(prompts, lengths.tolist(), per_token, 4 * hidden * layers,
                         layers * BUCKET_FLOPS if can_segment_trunk(trunk) else None)


def pack_completions(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                     lengths: torch.Tensor, pad_id: int = 0, row_tokens: int = 0,
                     share_prompts: bool = False, segments: bool = False) -> PackedRows:
    """Pack each row's real prompt and its first `lengths[b]` completion tokens (rows with length
    0 are left out: nothing of theirs is scored); with `share_prompts`, rows with the same prompt
    hold it once, each completion attending to it and to its own earlier tokens only. With
    `segments`: prompts shared, one row, and a plan for attention by segments."""
    share_prompts = share_prompts or segments
    prompts = real_prompts(prompt_ids, prompt_mask)
    completions = completion_ids.tolist()
    width = completion_ids.size(1)
    units = units_of(prompts, lengths.tolist(), share_prompts)
    coarse = segments and cpu_autocast(completion_ids.device)  # shapes on a coarse grid
    if segments:
        row_tokens = sum(u.size for u in units)
        row_tokens = round_up(row_tokens, token_grain(row_tokens)) if coarse else row_tokens
    capacity = max([row_tokens] + [u.size for u in units]) if units else 1
    rows = [[units[i] for i in row] for row in first_fit([u.size for u in units], capacity)]
    n_rows = max(len(rows), 1)
    ids = [[pad_id] * capacity for _ in range(n_rows)]
    # padding's positions are 0: a row may be longer than the model's context, and a model with
    # learned position embeddings has none past it (padding is attended by nothing but itself)
    positions = [[0] * capacity for _ in range(n_rows)]
    groups = [[-1 - i for i in range(capacity)] for _ in range(n_rows)]
    branches = [[0] * capacity for _ in range(n_rows)]
    predictor, located, targets, scatter = [], [], [], []
    parts: list[tuple[list[int], list[int]]] = []  # (context, own) flat positions, for a segment plan
    idle: list[int] = []  # positions of no segment (the coarse grid's padding)

    def put(r: int, at: int, tokens: list[int], first_position: int, group: int, branch: int) -> None:
        ids[r][at:at + len(tokens)] = tokens
        positions[r][at:at + len(tokens)] = range(first_position, first_position + len(tokens))
        groups[r][at:at + len(tokens)] = [group] * len(tokens)
        branches[r][at:at + len(tokens)] = [branch] * len(tokens)

    for r, members in enumerate(rows):
        at = 0
        for group, unit in enumerate(members):
            plen = len(unit.prompt)
            put(r, at, unit.prompt, 0, group, 0)
            last_prompt = r * capacity + at + plen - 1
            prompt_at = list(range(r * capacity + at, r * capacity + at + plen))
            parts.append(([], prompt_at))
            at += plen
            for branch, (b, n) in enumerate(zip(unit.rows, unit.lengths), start=1):
                put(r, at, completions[b][:n], plen, group, branch)
                first = r * capacity + at
                parts.append((prompt_at, list(range(first, first + n))))
                predictor += [last_prompt, *range(first, first + n - 1)]  # the last prompt token predicts the first
                located += range(first, first + n)
                targets += completions[b][:n]
                scatter += range(b * width, b * width + n)
                at += n
        if coarse and at < capacity:  # the grid's padding: attends to nothing, its attention output is zero
            positions[r][at:] = [0] * (capacity - at)
            idle += range(r * capacity + at, (r + 1) * capacity)
    device = completion_ids.device
    plan = plan_segments(parts, n_rows * capacity, device, 8 if coarse else 1, idle) if segments and units else None
    grid = lambda rows: long_tensor(chain.from_iterable(rows), device).view(n_rows, capacity)  # noqa: E731
    return PackedRows(grid(ids), grid(positions), grid(groups), grid(branches), long_tensor(predictor, device),
                      long_tensor(located, device), long_tensor(targets, device), long_tensor(scatter, device), plan)


def block_causal_mask(groups: torch.Tensor, branches: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Attention mask [R, 1, N, N], True (or 0 with a float `dtype`: additive, for eager
    attention) where a token may attend: same unit, not later, and the unit's prompt or its own
    completion; False (the dtype's minimum) elsewhere. Each padding position attends to itself
    only, so no softmax row is empty (an empty one would put NaN into the backward)."""
    n = groups.size(1)
    causal = torch.ones(n, n, dtype=torch.bool, device=groups.device).tril()
    same_unit = groups[:, :, None] == groups[:, None, :]
    visible_part = (branches[:, None, :] == 0) | (branches[:, :, None] == branches[:, None, :])
    allowed = (same_unit & visible_part & causal)[:, None]
    if dtype is None:
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype, device=groups.device).masked_fill_(~allowed, torch.finfo(dtype).min)


def packed_states(trunk: torch.nn.Module, packed: PackedRows, at: torch.Tensor | None = None) -> torch.Tensor:
    """The trunk's last hidden states [K, H] at the positions that predict the scored tokens
    (or at the flat positions `at`)."""
    if packed.plan is not None:
        states = segmented_forward(trunk, packed)
    else:
        eager = trunk.config._attn_implementation == "eager"
        mask = block_causal_mask(packed.groups, packed.branches, trunk.dtype if eager else None)
        states = trunk(input_ids=packed.input_ids, position_ids=packed.position_ids, attention_mask=mask,
                       use_cache=False).last_hidden_state
    # index_select, not indexing: a shared prompt's last position is gathered once per completion,
    # and indexing's backward adds those repeats with atomic adds across threads, in an order (so a
    # rounding) that changes from run to run; index_select's backward adds them in index order
    return states.reshape(-1, states.size(-1)).index_select(0, packed.predictor if at is None else at)


def segmented_forward(trunk: torch.nn.Module, packed: PackedRows) -> torch.Tensor:
    """The trunk's forward with attention by `packed.plan`. The mask it is given allows nothing:
    a layer that ignored the plan would put NaN in its output, and is caught by the count first."""
    states, calls = _segment_calls(trunk, packed)
    layers = _attention_layers(trunk, packed.plan)
    if calls < layers:
        raise RuntimeError(f"{type(trunk).__name__}: {calls} of {layers} attention layers ran lmpo's segment "
                           "attention (a model with its own attention entry?); load it with attn_implementation='eager' "
                           "to pack it under a mask instead")
    return states


def _segment_calls(trunk: torch.nn.Module, packed: PackedRows) -> tuple[torch.Tensor, int]:
    """The trunk's last hidden states with attention by `packed.plan`, and how many attention
    layers ran it."""
    plan = packed.plan
    plan.calls = 0
    nothing = torch.zeros(1, 1, 1, 1, dtype=torch.bool, device=packed.input_ids.device)
    states = trunk(input_ids=packed.input_ids, position_ids=packed.position_ids, attention_mask=nothing,
                   use_cache=False, lmpo_segments=plan).last_hidden_state
    return states, plan.calls


def _attention_layers(trunk: torch.nn.Module, plan: SegmentPlan) -> int:
    return getattr(trunk.config, "num_hidden_layers", plan.calls)


def last_states(trunk: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                answer_ids: torch.Tensor, lengths: torch.Tensor, layout: Layout) -> torch.Tensor:
    """The trunk's last hidden state [B, H] at each row's last token (its prompt, then its first
    `lengths[b]` >= 1 answer tokens), from one packed forward: what a reward model scores."""
    packed = pack_completions(prompt_ids, prompt_mask, answer_ids, lengths, row_tokens=layout.row_tokens,
                              share_prompts=layout.kind == "shared", segments=layout.kind == "segments")
    width = answer_ids.size(1)
    order = torch.full((answer_ids.numel(),), -1, dtype=torch.long, device=answer_ids.device)
    order[packed.scatter] = torch.arange(packed.scatter.numel(), device=answer_ids.device)
    last = order[torch.arange(answer_ids.size(0), device=answer_ids.device) * width + lengths - 1]
    return packed_states(trunk, packed, packed.located[last])

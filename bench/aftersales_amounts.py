"""How well after-sales models copy a refund's amount: the probe behind the README's count.

For the first `--tickets` held-out `refund` tickets (within the window and the approval limit,
so the right write is `issue_refund(ref, amount)`), the conversation is forced up to the write
through the real environment — the ticket, `lookup_order(ref)` and its observation,
`search_policy(refund)` and the handbook's text — and each model writes its next turn greedily.
The turn is sorted into: the order's amount copied right, a larger amount (what the guardrail
blocks), a smaller amount, or no refund call at all (a refusal, a hand-off, anything else).

    .venv/bin/python bench/aftersales_amounts.py RUN/sft/model RUN/grpo/model [--tickets 40]

where RUN is the `--out` of an `lmpo pipeline --task aftersales` run.

Prints a line per model and, last, one JSON object.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lmpo.envs.aftersales.task import Aftersales  # noqa: E402
from lmpo.models.loading import load_model_and_tokenizer  # noqa: E402
from lmpo.rollout.engines import LocalEngine  # noqa: E402
from lmpo.rollout.render import renderer_for  # noqa: E402
from lmpo.rollout.types import SamplingParams  # noqa: E402

REFUND = re.compile(r"^issue_refund\((o\d+),\s*\$?(\d+)\)$")


def forced_prompts(task: Aftersales, tickets: int) -> tuple[list[list[dict]], list[str], list[int]]:
    """The first `tickets` held-out `refund` tickets (of the 500 evaluation uses), each driven
    through the real environment up to the write: the conversations, order refs and amounts."""
    refunds = [p for p in task.heldout_problems(500) if p.meta["kind"] == "refund"][:tickets]
    if len(refunds) < tickets:
        raise SystemExit(f"--tickets {tickets}: the held-out set has {len(refunds)} refund tickets")
    env = task.make_env()
    conversations, refs, amounts = [], [], []
    for problem in refunds:
        messages = env.reset(problem)
        ref = problem.meta["order"]
        for call in (f"lookup_order({ref})", "search_policy(refund)"):
            step = env.step(call)
            observations = step.observation if isinstance(step.observation, list) else \
                [{"role": "tool", "content": step.observation}]
            messages += [{"role": "assistant", "content": call}, *observations]
        refund = next(c for c in problem.meta["expected"] if c[0] == "refund")
        conversations.append(messages)
        refs.append(ref)
        amounts.append(int(refund[2]))
    return conversations, refs, amounts


def classify(turn: str, ref: str, amount: int) -> str:
    match = REFUND.match(turn.strip())
    if not match or match.group(1) != ref:
        return "no_refund"
    written = int(match.group(2))
    return "right" if written == amount else "larger" if written > amount else "smaller"


def probe(model_dir: str, conversations: list[list[dict]], refs: list[str], amounts: list[int],
          task: Aftersales) -> dict:
    try:
        model, tokenizer = load_model_and_tokenizer(model_dir)
        renderer = renderer_for(task, tokenizer)  # a model without a chat template is refused here
    except (OSError, ValueError) as err:
        raise SystemExit(f"{model_dir}: not a saved after-sales model lmpo can load ({err})") from None
    model.eval()
    prompts = [renderer.prompt(c)[0] for c in conversations]
    engine = LocalEngine(model, tokenizer.eos_token_id, tokenizer.pad_token_id)
    with torch.no_grad():
        samples = engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=task.max_turn_tokens))
    counts = {"right": 0, "larger": 0, "smaller": 0, "no_refund": 0}
    examples = []
    for ref, amount, sample in zip(refs, amounts, samples):
        turn = tokenizer.decode(sample.token_ids, skip_special_tokens=True)
        verdict = classify(turn, ref, amount)
        counts[verdict] += 1
        if verdict != "right" and len(examples) < 3:
            examples.append(f"${amount}: {turn.strip()!r}")
    return {"model": model_dir, **counts, "examples": examples}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+",
                        help="saved after-sales models (a pipeline run's sft/model, grpo/model, ...)")
    parser.add_argument("--tickets", type=int, default=40, help="held-out refund tickets")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    if args.tickets < 1:
        parser.error(f"--tickets must be at least 1, got {args.tickets}")
    torch.set_num_threads(args.threads)
    task = Aftersales()
    conversations, refs, amounts = forced_prompts(task, args.tickets)
    results = []
    for model_dir in args.models:
        result = probe(model_dir, conversations, refs, amounts, task)
        results.append(result)
        print(f"{model_dir}: right {result['right']}, larger {result['larger']}, smaller {result['smaller']}, "
              f"no refund call {result['no_refund']} of {args.tickets}"
              + (f"  (e.g. {'; '.join(result['examples'])})" if result["examples"] else ""))
    print(json.dumps({"tickets": args.tickets, "results": results}))


if __name__ == "__main__":
    main()

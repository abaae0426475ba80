"""What training does with a trajectory, by why its episode ended.

- train: its tokens are trained with the reward it got;
- mask: its tokens get no gradient, but its reward still counts in its group's baseline
  (the default for length-type endings of multi-turn episodes: a cut-off episode says little
  about its last tokens; a single-turn completion cut by the limit follows the `overlong`
  option instead, DAPO's setting for exactly that case, which by default trains on it);
- penalise: trained, with `penalty` subtracted from its reward;
- exclude: left out of the loss and of the group baseline, like an unscorable reward (the
  default for infrastructure failures, which are not the model's doing).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lmpo.envs.env import INFRASTRUCTURE_ENDINGS, LENGTH_ENDINGS, TERMINATIONS

ACTIONS = ("train", "mask", "penalise", "exclude")
DEFAULT_ACTIONS = {reason: "mask" if reason in LENGTH_ENDINGS else "exclude" if reason in INFRASTRUCTURE_ENDINGS
                   else "train" for reason in TERMINATIONS}


@dataclass
class TerminationPolicy:
    actions_by_reason: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_ACTIONS))
    penalty: float = 1.0

    @classmethod
    def parse(cls, spec: str, penalty: float = 1.0, multi_turn: bool = True) -> "TerminationPolicy":
        """`"turn_length=train,max_turns=penalise"` on top of the defaults."""
        actions = dict(DEFAULT_ACTIONS)
        if not multi_turn:
            actions.update({r: "train" for r in LENGTH_ENDINGS})
        for item in filter(None, (x.strip() for x in spec.split(","))):
            reason, eq, action = (part.strip() for part in item.partition("="))
            if reason == "length":  # every length-type ending at once
                reasons = list(LENGTH_ENDINGS)
            elif reason in TERMINATIONS:
                reasons = [reason]
            else:
                raise ValueError(f"termination_policy: unknown reason {reason!r} in {spec!r}; choose from "
                                 f"{', '.join(TERMINATIONS)} or 'length'")
            if not eq or action not in ACTIONS:
                raise ValueError(f"termination_policy: {item!r} must be reason=action with action one of "
                                 f"{', '.join(ACTIONS)}")
            actions.update({r: action for r in reasons})
        return cls(actions, penalty)

    def actions(self, reasons: list[str]) -> list[str]:
        return [self.actions_by_reason[r] for r in reasons]

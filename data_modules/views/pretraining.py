"""The pretraining view (``data.task=pretraining``): ordered (sub-)sequences of at least ``min_steps`` steps."""
from __future__ import annotations

from typing import Sequence

from data_modules.views.base import TaskView, ViewItem, _rng, restrict_procedure
from data_modules.views.registry import register_view
from seqaware.procedure import Procedure


@register_view
class PretrainingView(TaskView):
    """Ordered sub-sequences of ``min_steps..max_steps`` steps, in authored order.

    Each epoch draws, per procedure, a length and the steps from ``(seed, epoch, index)``:
    ``contiguous=True`` a window (consecutive steps), ``contiguous=False`` any ``length`` steps kept in
    their authored order (a sub-sampled sequence, Wu et al. sec. 4.2), so two kept steps may lie
    several steps apart, as the two steps that ISP swaps in a whole 5-step sequence do.
    ``subsequences=False`` always uses the first ``max_steps`` steps.
    """

    task = "pretraining"
    # data/base.yaml sets too_long for every view; a sub-sequence never exceeds max_steps
    ignores = ("too_long", "reference_limit")

    def __init__(self, procedures: Sequence[Procedure], max_steps: int = 5, min_steps: int = 2, subsequences: bool = True,
                 contiguous: bool = True, seed: int = 0, name: str = "pretraining"):
        super().__init__(procedures, max_steps, "truncate", seed, name)
        if not 2 <= min_steps <= max_steps:
            raise ValueError(f"need 2 <= data.view.min_steps <= data.view.max_steps, got {min_steps}, {max_steps}")
        self.min_steps = int(min_steps)
        self.subsequences = subsequences
        self.contiguous = bool(contiguous)

    def __getitem__(self, key) -> ViewItem:
        idx, epoch = self._key(key)
        proc = self.procedures[idx]
        n = proc.num_steps
        if self.subsequences:
            rng = _rng(self.seed, proc.id, epoch, "window")
            length = int(rng.integers(min(self.min_steps, n), min(self.max_steps, n) + 1))
            if self.contiguous:
                start = int(rng.integers(0, n - length + 1))
                keep = list(range(start, start + length))
            else:
                keep = sorted(int(i) for i in rng.choice(n, size=length, replace=False))
        else:
            keep = list(range(min(n, self.max_steps)))
            length = len(keep)
        steps, edges, _ = restrict_procedure(proc, keep)
        return ViewItem(
            procedure_id=proc.id,
            steps=steps,
            step_index=keep,
            gold=list(range(length)),
            references=[list(range(length))],
            dag=None if edges is None else (length, edges),
            category=proc.category,
            root=proc.root,
        )

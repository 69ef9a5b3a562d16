"""The sequencing view (``data.task=sequencing``): the steps of a procedure in a seeded shuffled order; the
target is the authored order; references are the explicit alternatives or all linear extensions of the DAG."""
from __future__ import annotations

from typing import Any, Sequence

from data_modules.views.base import TaskView, ViewItem, _rng, reference_orders, restrict_procedure
from data_modules.views.registry import register_view
from seqaware.procedure import Procedure


@register_view
class SequencingView(TaskView):
    """Shuffled steps of each procedure; target = authored order.

    ``reshuffle=False`` (evaluation) gives every procedure one fixed permutation derived from
    ``(seed, procedure id)``; ``reshuffle=True`` (training) draws a new one per epoch.
    """

    task = "sequencing"

    @classmethod
    def build(cls, procedures: Sequence[Procedure], split: str, seed: int = 0, reshuffle_train: bool = True,
              **options: Any) -> "SequencingView":
        """The training split reshuffles every epoch unless ``data.reshuffle_train=false``; evaluation never does."""
        return cls(procedures, seed=seed, reshuffle=split == "train" and reshuffle_train, name=f"{split} {cls.task}",
                   **options)

    def __init__(self, procedures: Sequence[Procedure], max_steps: int = 5, too_long: str = "truncate", seed: int = 0,
                 reshuffle: bool = False, reference_limit: int = 10000, name: str = "sequencing"):
        super().__init__(procedures, max_steps, too_long, seed, name)
        self.reshuffle = reshuffle
        self.reference_limit = reference_limit
        self.over_limit = 0
        self._cache: dict[int, tuple] = {}

    def _structure(self, idx: int):
        if idx not in self._cache:
            proc = self.procedures[idx]
            keep = list(range(min(proc.num_steps, self.max_steps)))
            steps, edges, alternatives = restrict_procedure(proc, keep)
            refs, over = reference_orders(len(steps), edges, alternatives, self.reference_limit)
            self.over_limit += over
            self._cache[idx] = (steps, edges, refs)
        return self._cache[idx]

    def __getitem__(self, key) -> ViewItem:
        idx, epoch = self._key(key)
        proc = self.procedures[idx]
        steps, edges, refs = self._structure(idx)
        n = len(steps)
        rng = _rng(self.seed, proc.id, epoch if self.reshuffle else "eval")
        perm = [int(i) for i in rng.permutation(n)]  # perm[p] = original index at input position p
        position = {orig: p for p, orig in enumerate(perm)}
        return ViewItem(
            procedure_id=proc.id,
            steps=[steps[i] for i in perm],
            step_index=perm,
            gold=[position[k] for k in range(n)],
            references=refs,
            dag=None if edges is None else (n, edges),
            category=proc.category,
            root=proc.root,
        )

"""Size and look of a synthetic world (:class:`SyntheticConfig`, every field part of the cache key) and
the generator versions that name its cached copies."""
from __future__ import annotations

from dataclasses import dataclass

from data_modules.synthetic.scenes import _CATEGORY_SPECS

GENERATOR = "synthetic-v1"
HARD_GENERATOR = "hard-v2"
"""Bumped when the hard world's procedures change (v2: at most two chains), so cached copies are redone."""
SPLITS = ("train", "val", "test")
CATEGORIES = ("stacking", "filling", "garden")
HARD_CATEGORIES = ("stacking", "filling")
"""Categories the hard world can build: in the garden the part names alone (trunk, crown, fruit)
give the order away."""


@dataclass
class SyntheticConfig:
    """Size and look of the synthetic dataset; every field takes part in the cache key."""

    num_train: int = 800
    num_val: int = 100
    num_test: int = 100
    min_steps: int = 3
    max_steps: int = 5
    image_size: int = 128
    """Rendered square PNG size in pixels."""
    ambiguous_text_prob: float = 0.4
    """Share of steps whose text omits the disambiguating detail."""
    seed: int = 0
    categories: tuple[str, ...] = CATEGORIES
    difficulty: str = "easy"
    """``easy``: each image shows the cumulative scene, so the order is readable from the images.
    ``hard``: each image shows only the object its step adds (moved to a random place, beside
    neutral distractor shapes) and each text names what the step needs, not what it adds; neither
    modality alone gives the order, the two together determine the DAG (see
    :func:`~data_modules.synthetic.assemble.make_procedure`); a procedure has one or two chains, so long
    chains with a single valid order are common."""

    def __post_init__(self) -> None:
        # Normalize types (Hydra passes ListConfig, YAML may give 0 for 0.0) so equal configs hash alike.
        for name in ("num_train", "num_val", "num_test", "min_steps", "max_steps", "image_size", "seed"):
            setattr(self, name, int(getattr(self, name)))
        self.ambiguous_text_prob = float(self.ambiguous_text_prob)
        self.categories = tuple(str(c) for c in self.categories)
        unknown = [c for c in self.categories if c not in _CATEGORY_SPECS]
        if unknown or not self.categories:
            raise ValueError(f"categories must be a non-empty subset of {CATEGORIES}, got {self.categories}")
        for name in ("num_train", "num_val", "num_test"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 2 <= self.min_steps <= self.max_steps:
            raise ValueError(f"need 2 <= min_steps <= max_steps, got {self.min_steps} and {self.max_steps}")
        limit = min(_CATEGORY_SPECS[c].capacity for c in self.categories)
        if self.max_steps > limit:
            raise ValueError(f"max_steps={self.max_steps} is more than the categories {self.categories} "
                             f"can build (at most {limit} steps)")
        if self.image_size < 32:
            raise ValueError(f"image_size must be >= 32 pixels, got {self.image_size}")
        if not 0.0 <= self.ambiguous_text_prob <= 1.0:
            raise ValueError(f"ambiguous_text_prob must be in [0, 1], got {self.ambiguous_text_prob}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        self.difficulty = str(self.difficulty)
        if self.difficulty not in ("easy", "hard"):
            raise ValueError(f"difficulty must be 'easy' or 'hard', got {self.difficulty!r}")
        if self.difficulty == "hard" and set(self.categories) - set(HARD_CATEGORIES):
            raise ValueError(f"difficulty=hard builds the categories {list(HARD_CATEGORIES)} only (in the garden the "
                             f"part names give the order away); got categories={list(self.categories)}")

    def split_sizes(self) -> dict[str, int]:
        return {"train": self.num_train, "val": self.num_val, "test": self.num_test}

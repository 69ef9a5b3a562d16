"""Small writers and readers the adapter tests share (tests/ is on sys.path, as for preempt_helpers)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image


def jsonl(path: Path, records) -> Path:
    """Write ``records`` one per line (dicts as JSON, strings as they are, e.g. a broken line)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def mean_color(path: Path) -> tuple[int, ...]:
    """The mean RGB colour of an image file, rounded."""
    with Image.open(path) as img:
        return tuple(int(v) for v in np.asarray(img.convert("RGB")).reshape(-1, 3).mean(0).round())

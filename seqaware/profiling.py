"""Where a training step's time goes: the top operators of a few profiled steps (the benchmark scripts'
``--profile N``; ``scripts/gpu_check.py`` writes them into its report)."""
from __future__ import annotations

from typing import Any, Callable


def profile_top(step: Callable[[], Any], steps: int = 3, top: int = 12, cuda: bool = False) -> list[dict[str, Any]]:
    """Run ``step`` ``steps`` times under ``torch.profiler`` and return the ``top`` operators by self time
    (CUDA self time when ``cuda``, else CPU self time): ``{name, calls, self_ms, share}`` per operator, the
    time per profiled step and ``share`` its fraction of the total self time of all operators."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize()
    events = prof.key_averages()
    attr = "self_device_time_total" if cuda else "self_cpu_time_total"
    total = sum(getattr(e, attr, 0.0) for e in events) or 1.0
    ranked = sorted(events, key=lambda e: getattr(e, attr, 0.0), reverse=True)[:top]
    return [{"name": e.key, "calls": int(e.count) // max(steps, 1), "self_ms": getattr(e, attr, 0.0) / 1000 / steps,
             "share": getattr(e, attr, 0.0) / total} for e in ranked]


def format_profile(rows: list[dict[str, Any]]) -> str:
    """A markdown table of :func:`profile_top` rows."""
    lines = ["| operator | calls / step | self ms / step | share |", "|---|---:|---:|---:|"]
    lines += [f"| `{r['name']}` | {r['calls']} | {r['self_ms']:.2f} | {100 * r['share']:.1f}% |" for r in rows]
    return "\n".join(lines)

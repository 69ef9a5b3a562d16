"""Where a training step's time goes: the top operators of a few profiled steps (the benchmark scripts'
``--profile N``; ``scripts/gpu_check.py`` writes them into its report)."""
from __future__ import annotations

from typing import Any, Callable


def profile_step(step: Callable[[], Any], steps: int = 3, top: int = 12, cuda: bool = False) -> dict[str, Any]:
    """Run ``step`` ``steps`` times under ``torch.profiler``: the top operators (:func:`profile_top`'s rows),
    the wall time per step and, with ``cuda``, the time per step the GPU was busy running kernels (the union of
    the kernels' intervals). Busy time well under wall time means the step waits on the host (Python,
    launches, synchronisations, the data) rather than on the GPU."""
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - start
    events = prof.key_averages()
    attr = "self_device_time_total" if cuda else "self_cpu_time_total"
    total = sum(getattr(e, attr, 0.0) for e in events) or 1.0
    ranked = sorted(events, key=lambda e: getattr(e, attr, 0.0), reverse=True)[:top]
    rows = [{"name": e.key, "calls": int(e.count) // max(steps, 1), "self_ms": getattr(e, attr, 0.0) / 1000 / steps,
             "share": getattr(e, attr, 0.0) / total} for e in ranked]
    out: dict[str, Any] = {"top": rows, "wall_ms": 1000 * wall / max(steps, 1)}
    if cuda:
        out["device_busy_ms"] = busy_us(prof.events()) / 1000 / max(steps, 1)
    return out


def busy_us(events: Any) -> float:
    """Microseconds covered by the union of the device (kernel and copy) events' intervals."""
    from torch.autograd import DeviceType

    spans = sorted((e.time_range.start, e.time_range.end) for e in events
                   if getattr(e, "device_type", None) == DeviceType.CUDA and e.time_range.end > e.time_range.start)
    busy, end = 0.0, float("-inf")
    for s, e in spans:
        if s > end:
            busy += e - s
            end = e
        elif e > end:
            busy += e - end
            end = e
    return busy


def profile_top(step: Callable[[], Any], steps: int = 3, top: int = 12, cuda: bool = False) -> list[dict[str, Any]]:
    """Run ``step`` ``steps`` times under ``torch.profiler`` and return the ``top`` operators by self time
    (CUDA self time when ``cuda``, else CPU self time): ``{name, calls, self_ms, share}`` per operator, the
    time per profiled step and ``share`` its fraction of the total self time of all operators."""
    return profile_step(step, steps, top, cuda)["top"]


def format_profile(rows: list[dict[str, Any]]) -> str:
    """A markdown table of :func:`profile_top` rows."""
    lines = ["| operator | calls / step | self ms / step | share |", "|---|---:|---:|---:|"]
    lines += [f"| `{r['name']}` | {r['calls']} | {r['self_ms']:.2f} | {100 * r['share']:.1f}% |" for r in rows]
    return "\n".join(lines)

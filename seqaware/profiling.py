"""Where a training step's time goes: the top operators of a few profiled steps (the benchmark scripts'
``--profile N``; ``scripts/gpu_check.py`` writes them into its report)."""
from __future__ import annotations

from typing import Any, Callable


def profile_figures(step: Callable[[], Any], steps: int = 3, top: int = 12, cuda: bool = False) -> dict[str, Any]:
    """Run ``step`` ``steps`` times under ``torch.profiler``; returns a benchmark's profile figures:

    * ``profile``: the ``top`` operators by self time (CUDA self time when ``cuda``, else CPU self time),
      ``{name, calls, self_ms, share}`` per operator, per profiled step, ``share`` its fraction of the total
      self time of all operators;
    * ``profile_wall_ms``: the wall time per step;
    * ``profile_device_busy_ms`` (``cuda`` only): the time per step the GPU was running kernels (the union of
      their intervals). Busy time well under wall time means the step waits on the host (Python, launches,
      synchronisations, the data) rather than on the GPU.
    """
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
    out: dict[str, Any] = {"profile": rows, "profile_wall_ms": 1000 * wall / max(steps, 1)}
    if cuda:
        out["profile_device_busy_ms"] = busy_us(prof.events()) / 1000 / max(steps, 1)
    return out


def profile_summary(figures: dict[str, Any]) -> str:
    """"a profiled step: W ms wall, GPU busy B ms" from :func:`profile_figures` output ("" without a GPU)."""
    if "profile_device_busy_ms" not in figures:
        return ""
    return (f"a profiled step: {figures['profile_wall_ms']:.0f} ms wall, "
            f"GPU busy {figures['profile_device_busy_ms']:.0f} ms")


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


def format_profile(rows: list[dict[str, Any]]) -> str:
    """A markdown table of the ``profile`` rows of :func:`profile_figures`."""
    lines = ["| operator | calls / step | self ms / step | share |", "|---|---:|---:|---:|"]
    lines += [f"| `{r['name']}` | {r['calls']} | {r['self_ms']:.2f} | {100 * r['share']:.1f}% |" for r in rows]
    return "\n".join(lines)

"""Where a profiled run's GPU waits: busy and idle time from a torch.profiler (Kineto) Chrome trace.

An operator table sums kernel times; it cannot say how long the device sat idle between them, which is what a
batch-1 decode step loses to the host (graph launches, copies, synchronisations). ``timeline_summary`` merges the
device intervals (kernels, copies, sets) of a trace, reports their span, busy time and idle time, the idle time
by the host runtime calls (``cudaGraphLaunch``, ``cudaMemcpyAsync``, ...) running when each gap began, and the
longest gaps.
"""
from __future__ import annotations

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATEGORIES = ("cuda_runtime", "cuda_driver")


def _intervals(events: list, categories: tuple) -> list[tuple[float, float, str]]:
    return sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), str(e.get("name", "")))
                  for e in events if e.get("ph") == "X" and e.get("cat") in categories)


def _merge(spans: list[tuple[float, float, str]]) -> list[list]:
    """Union of intervals sorted by start: [start, end] lists (overlapping kernels on several streams count once)."""
    merged: list[list] = []
    for start, end, _ in spans:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def timeline_stats(trace: dict, steps: int = 1, top: int = 5) -> dict:
    """Microseconds: span (first device start to last device end), busy (union of device intervals), idle
    (span - busy), each also per step (``steps``), and the ``top`` longest gaps: their length, start and the
    host runtime calls overlapping the gap's start. Empty dict without device events (a CPU profile)."""
    events = trace.get("traceEvents", [])
    device = _intervals(events, DEVICE_CATEGORIES)
    if not device:
        return {}
    merged = _merge(device)
    span = merged[-1][1] - merged[0][0]
    busy = sum(end - start for start, end in merged)
    host = _intervals(events, HOST_CATEGORIES)

    def running(at: float) -> list[str]:
        return sorted({name for s, e, name in host if s <= at <= e})

    gaps = sorted(((b[0] - a[1], a[1]) for a, b in zip(merged, merged[1:])), reverse=True)
    # every gap's time, by the host calls running when it began ("-": none, the host was in Python)
    by_host: dict[str, float] = {}
    for length, at in gaps:
        key = ", ".join(running(at)) or "-"
        by_host[key] = by_host.get(key, 0.0) + length
    return {
        "span_us": span, "busy_us": busy, "idle_us": span - busy, "steps": steps,
        "span_per_step_us": span / steps, "busy_per_step_us": busy / steps, "idle_per_step_us": (span - busy) / steps,
        "device_intervals": len(device),
        "idle_per_step_by_host_us": {k: v / steps for k, v in sorted(by_host.items(), key=lambda kv: -kv[1])},
        "gaps": [{"us": length, "at_us": at - merged[0][0], "host": running(at)} for length, at in gaps[:top]],
    }


def timeline_summary(trace: dict, steps: int = 1, top: int = 5) -> str:
    """``timeline_stats`` as a few lines of text (appended to a profile's operator table)."""
    st = timeline_stats(trace, steps, top)
    if not st:
        return "timeline: no device events (a CPU profile)\n"
    lines = [f"timeline over {steps} step(s): device span {st['span_per_step_us']:.1f} us a step, busy "
             f"{st['busy_per_step_us']:.1f} us, idle {st['idle_per_step_us']:.1f} us "
             f"({st['device_intervals']} device intervals)",
             "idle a step by the host calls running when each gap began ('-': none):"]
    lines += [f"  {us:.1f} us: {key}" for key, us in st["idle_per_step_by_host_us"].items()]
    lines.append("longest gaps (us, at us from the first device event, host calls running when the gap began):")
    lines += [f"  {g['us']:.1f} at {g['at_us']:.1f}: {', '.join(g['host']) or '-'}" for g in st["gaps"]]
    return "\n".join(lines) + "\n"

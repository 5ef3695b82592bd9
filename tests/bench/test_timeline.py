"""bench.timeline: the device's busy and idle time and its longest gaps, from a Chrome trace."""
from foxformer.bench.timeline import timeline_stats, timeline_summary


def _x(cat, name, ts, dur):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}


TRACE = {"traceEvents": [
    _x("cuda_runtime", "cudaGraphLaunch", 0, 30),
    _x("kernel", "a", 10, 20),            # 10..30
    _x("kernel", "b", 25, 15),            # 25..40: overlaps a (another stream): counted once
    _x("cuda_runtime", "cudaMemcpyAsync", 38, 10),
    _x("gpu_memcpy", "Memcpy HtoD", 50, 5),   # gap 40..50 (10 us), host in cudaMemcpyAsync at 40
    _x("cpu_op", "aten::mm", 0, 100),       # host work: not a device interval
    _x("kernel", "c", 80, 20),            # gap 55..80 (25 us), nothing on the host
    {"ph": "i", "cat": "kernel", "name": "marker", "ts": 5},   # not a complete event
]}


def test_busy_idle_and_gaps():
    st = timeline_stats(TRACE, steps=2, top=5)
    assert st["span_us"] == 90 and st["busy_us"] == 30 + 5 + 20 and st["idle_us"] == 35
    assert st["idle_per_step_us"] == 17.5 and st["device_intervals"] == 4
    assert [(g["us"], g["at_us"], g["host"]) for g in st["gaps"]] == [(25, 45, []), (10, 30, ["cudaMemcpyAsync"])]
    assert st["idle_per_step_by_host_us"] == {"-": 12.5, "cudaMemcpyAsync": 5.0}
    text = timeline_summary(TRACE, steps=2)
    assert "busy 27.5 us, idle 17.5 us" in text and "10.0 at 30.0: cudaMemcpyAsync" in text and "5.0 us: cudaMemcpyAsync" in text


def test_cpu_profile_has_no_device_events():
    assert timeline_stats({"traceEvents": [_x("cpu_op", "aten::add", 0, 5)]}) == {}
    assert "no device events" in timeline_summary({"traceEvents": []})

"""Peak CPU bytes a function allocates, from the torch profiler's memory events. Not a test file.

The profiler gives each op the net bytes it allocated itself ("self") and records a child op's allocations on the
child. A net allocation is counted at the op's start and a net release at its end, so a temporary that an op frees
before returning (torch.multinomial's noise, freed inside multinomial after its empty_like child allocated it) is
counted over the whole op: the figure is never below the true peak.
"""

from torch.profiler import ProfilerActivity, profile


def peak_alloc_bytes(fn) -> int:
    """Peak bytes allocated by fn on the CPU, above what was live when it started."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    deltas = []
    for e in prof.events():
        if e.name == "[memory]":  # an allocation or release outside any op
            deltas.append((e.time_range.start, e.cpu_memory_usage))
        elif e.self_cpu_memory_usage > 0:
            deltas.append((e.time_range.start, e.self_cpu_memory_usage))
        elif e.self_cpu_memory_usage < 0:
            deltas.append((e.time_range.end, e.self_cpu_memory_usage))
    cur = peak = 0
    for _, delta in sorted(deltas, key=lambda d: (d[0], -d[1])):  # at equal times, allocations first
        cur += delta
        peak = max(peak, cur)
    return peak

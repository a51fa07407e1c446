def merge(intervals):
    """Sorted, merged [start, end] pairs of ``intervals``; touching intervals ([1, 2], [2, 3]) merge."""
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged

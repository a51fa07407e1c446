def average_latency(samples_ms):
    """The mean of ``samples_ms``; 0.0 for an empty window."""
    return sum(samples_ms) / len(samples_ms)


def p_max(samples_ms):
    return max(samples_ms, default=0)

def merge(intervals):
    """Sorted, merged [start, end] pairs of ``intervals``; touching intervals ([1, 2], [2, 3]) merge."""
    raise NotImplementedError

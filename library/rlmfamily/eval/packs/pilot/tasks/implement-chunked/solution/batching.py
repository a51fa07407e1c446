def chunked(items, size):
    """``items`` in lists of ``size`` (the last may be shorter); ValueError when size < 1."""
    if size < 1:
        raise ValueError(size)
    items = list(items)
    return [items[i:i + size] for i in range(0, len(items), size)]

def chunked(items, size):
    """``items`` in lists of ``size`` (the last may be shorter); ValueError when size < 1."""
    raise NotImplementedError

def paginate(items, page, size):
    """Page ``page`` (1 is the first) of ``items``, ``size`` items a page."""
    start = page * size
    return items[start:start + size]

def add_tag(tag, tags=None):
    """The list ``tags`` (a new one when not given) with ``tag`` appended."""
    if tags is None:
        tags = []
    tags.append(tag)
    return tags

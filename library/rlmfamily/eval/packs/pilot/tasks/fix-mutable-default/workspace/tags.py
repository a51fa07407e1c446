def add_tag(tag, tags=[]):
    """The list ``tags`` (a new one when not given) with ``tag`` appended."""
    tags.append(tag)
    return tags

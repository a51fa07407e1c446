def parse_duration(text):
    """Seconds in ``text``, a sequence of <integer><unit> with units h, m, s in that order, each at most once
    ("1h30m" -> 5400, "45s" -> 45). ValueError for anything else, the empty string included."""
    raise NotImplementedError

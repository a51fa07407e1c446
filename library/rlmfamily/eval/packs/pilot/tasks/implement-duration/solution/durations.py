import re

PATTERN = re.compile(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")


def parse_duration(text):
    """Seconds in ``text``, a sequence of <integer><unit> with units h, m, s in that order, each at most once
    ("1h30m" -> 5400, "45s" -> 45). ValueError for anything else, the empty string included."""
    match = PATTERN.fullmatch(text)
    if not text or match is None:
        raise ValueError(text)
    h, m, s = (int(g) if g else 0 for g in match.groups())
    return h * 3600 + m * 60 + s

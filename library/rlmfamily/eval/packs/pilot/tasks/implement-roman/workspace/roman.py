def to_roman(n):
    """``n`` (1..3999) in Roman numerals, subtractive notation (4 = IV); ValueError outside that range."""
    raise NotImplementedError

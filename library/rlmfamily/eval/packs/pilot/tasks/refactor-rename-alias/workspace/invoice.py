def calc(lines, tax_rate):
    """The total of (quantity, unit price) lines, with tax, rounded to cents."""
    subtotal = sum(q * p for q, p in lines)
    return round(subtotal * (1 + tax_rate), 2)

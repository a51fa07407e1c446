import warnings


def compute_invoice_total(lines, tax_rate):
    """The total of (quantity, unit price) lines, with tax, rounded to cents."""
    subtotal = sum(q * p for q, p in lines)
    return round(subtotal * (1 + tax_rate), 2)


def calc(lines, tax_rate):
    """Deprecated: compute_invoice_total()."""
    warnings.warn("calc() is deprecated; use compute_invoice_total()", DeprecationWarning, stacklevel=2)
    return compute_invoice_total(lines, tax_rate)

from store.pricing import discounted


def line_total(qty, unit_cents, percent):
    return discounted(qty * unit_cents, percent)


def cart_total(lines, percent):
    """The cart's total in cents, ``percent`` off every line."""
    return discounted(sum(line_total(q, u, percent) for q, u in lines), percent)

def order_total(order):
    """Quantity x unit price over the order's lines, less its discount."""
    return sum(line["qty"] * line["unit_price"] for line in order["lines"]) - order.get("discount", 0)


def summarize(orders):
    """Total revenue and the largest order's total."""
    totals = [order_total(order) for order in orders]
    return {"revenue": sum(totals), "largest": max([0, *totals])}

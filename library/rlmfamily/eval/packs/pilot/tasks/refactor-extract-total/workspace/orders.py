def summarize(orders):
    """Total revenue and the largest order's total."""
    revenue = 0
    largest = 0
    for order in orders:
        total = 0
        for line in order["lines"]:
            total += line["qty"] * line["unit_price"]
        total -= order.get("discount", 0)
        revenue += total
        if total > largest:
            largest = total
    return {"revenue": revenue, "largest": largest}

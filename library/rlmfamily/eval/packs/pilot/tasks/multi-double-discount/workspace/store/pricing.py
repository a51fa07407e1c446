def discounted(amount, percent):
    """``amount`` less ``percent`` per cent, in cents (rounded down)."""
    return amount * (100 - percent) // 100

SYMBOLS = {"EUR": "€", "USD": "$", "GBP": "£"}


def format_price(price):
    """'€12.50' for {"amount": 12.5, "currency": "EUR"}; the currency defaults to EUR."""
    symbol = SYMBOLS[price["currency"]]
    return f"{symbol}{price['amount']:.2f}"

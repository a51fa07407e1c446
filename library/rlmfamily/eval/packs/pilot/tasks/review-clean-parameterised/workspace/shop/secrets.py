import os


def api_key() -> str:
    """The payment provider's key, from the environment (never in code)."""
    return os.environ["PAYMENTS_API_KEY"]

import threading

_balances = {}
_lock = threading.Lock()


def deposit(account, amount):
    with _lock:
        _balances[account] = _balances.get(account, 0) + amount


def withdraw(account, amount):
    """Take ``amount`` from ``account`` if it holds enough; True when it did."""
    if _balances.get(account, 0) >= amount:
        _balances[account] = _balances[account] - amount
        return True
    return False

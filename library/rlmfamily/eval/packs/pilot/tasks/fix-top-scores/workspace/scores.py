def top_scores(players, n):
    """The ``n`` (name, score) pairs with the highest scores, best first; ties keep their input order."""
    return sorted(players, key=lambda p: p[0], reverse=True)[:n]

import re


def slugify(title):
    """Lower-case ``title``; every run of characters that are not ASCII letters or digits becomes one
    hyphen; no hyphen at either end. "Hello, World!" -> "hello-world"."""
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")

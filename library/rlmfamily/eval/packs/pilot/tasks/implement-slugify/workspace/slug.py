def slugify(title):
    """Lower-case ``title``; every run of characters that are not ASCII letters or digits becomes one
    hyphen; no hyphen at either end. "Hello, World!" -> "hello-world"."""
    raise NotImplementedError

import os

BASE = "/srv/uploads"


def read_upload(name):
    """The bytes of an uploaded file, by the name the client gives."""
    path = os.path.join(BASE, name)
    with open(path, "rb") as fh:
        return fh.read()


def upload_size(name):
    safe = os.path.basename(name)
    return os.path.getsize(os.path.join(BASE, safe))

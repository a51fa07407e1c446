from shop import settings


def request_options():
    return {"timeout": settings.TIMEOUT, "attempts": settings.MAX_ATTEMPTS}

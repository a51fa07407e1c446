from shop import settings


def request_options():
    return {"timeout": settings.REQUEST_TIMEOUT_S, "attempts": settings.MAX_ATTEMPTS}

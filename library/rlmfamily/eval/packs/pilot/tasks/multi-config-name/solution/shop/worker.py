from shop import settings


def backoff_plan():
    return [settings.REQUEST_TIMEOUT_S * (2 ** i) for i in range(settings.MAX_ATTEMPTS)]

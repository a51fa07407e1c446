from shop import settings


def backoff_plan():
    return [settings.TIMEOUT * (2 ** i) for i in range(settings.MAX_ATTEMPTS)]

"""vLLM plugin placeholder (filled in below)."""


def register() -> None:
    return None

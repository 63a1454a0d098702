"""Local mode: the store services and the gateway in one process (``rocketstore serve broker``)."""

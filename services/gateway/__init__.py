"""The client-facing gateway. Not built yet."""

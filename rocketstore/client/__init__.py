"""The Python client of the rocketstore gateway: producer, consumers and admin."""

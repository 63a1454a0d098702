"""The rocketstore services; each subpackage is one process."""

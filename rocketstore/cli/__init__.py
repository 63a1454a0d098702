"""The command line: ``rocketstore`` and its commands, the launcher of ``rocketstore up``, the demo, doctor."""

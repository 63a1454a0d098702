"""``python -m rocketstore`` is the ``rocketstore`` command."""

from rocketstore.cli.main import main

raise SystemExit(main())

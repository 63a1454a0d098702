"""``python -m rocketstore`` is the ``rocketstore`` command."""

from rocketstore.cli import main

raise SystemExit(main())

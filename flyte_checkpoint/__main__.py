"""``python -m flyte_checkpoint`` runs the ``flyte-checkpoint`` command."""

from flyte_checkpoint.cli import main

raise SystemExit(main())

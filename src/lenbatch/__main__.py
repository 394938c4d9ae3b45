"""``python -m lenbatch`` (and ``torchrun -m lenbatch train ...``) run the CLI."""

from lenbatch.cli import main

raise SystemExit(main())

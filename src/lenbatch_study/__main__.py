"""``python -m lenbatch_study`` (and ``torchrun -m lenbatch_study train ...``) run the CLI."""

from lenbatch_study.cli import main

raise SystemExit(main())

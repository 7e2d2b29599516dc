"""`python -m harness`: the treebench command line (see harness.cli)."""

from harness.cli import main

raise SystemExit(main())

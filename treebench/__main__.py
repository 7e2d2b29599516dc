"""`python -m treebench`: the treebench command line (the console script's entry)."""

from treebench.harness.cli.entry import main

raise SystemExit(main())

"""`python -m treebench.harness`: the treebench command line (see treebench.harness.cli.main.main)."""

from treebench.harness.cli.entry import main

raise SystemExit(main())

"""`python -m treebench.harness`: the treebench command line (see treebench.harness.cli.main.main)."""

from treebench import main

raise SystemExit(main())

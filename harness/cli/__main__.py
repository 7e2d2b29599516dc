"""`python -m treebench.harness.cli`: the treebench command line."""

from treebench.harness.cli.main import main

raise SystemExit(main())

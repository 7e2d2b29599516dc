"""`python -m treebench`: the treebench command line (the console script's entry)."""

from treebench import main

raise SystemExit(main())

"""How long a call takes: timers, the time budget, the peak-bandwidth measurement and
the statistics of raw samples. Imports treebench.harness.errors and harness.model only."""

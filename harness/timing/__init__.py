"""How long a call takes: the timer names (modes), the budget and `Timing` record (budget),
the CPU's wall timer (wall), the CUDA timers (timers), the peak-bandwidth measurement
(bandwidth) and the statistics of raw samples (stats). Imports treebench.harness.errors
and harness.model only."""

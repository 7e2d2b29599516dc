"""The timer names `time_callable` accepts, and those a result row records, without importing torch
(the CLI's --timer choices; the readers of rows, which need no torch).

``auto`` picks ``cuda_graph`` on a GPU and ``wall`` on the CPU; the others are
described in `treebench.harness.timing.timers`. ``wall`` is not a mode one asks
for: it is the CPU's only timer, and a CUDA timer asked for on the CPU falls back to it.
"""

AUTO = "auto"   # the mode that picks a timer for the device
MODES = (AUTO, "cuda_graph", "cuda_event", "host_inclusive", "cuda_graph_loop")
WALL = "wall"   # the CPU's timer, as rows record it
# A row's `timer`: the timer that took its samples (`timers.time_callable`'s Timing.timer): every mode but
# auto, which is never recorded (it picks one of the others), and the CPU's wall.
TIMERS = (*(m for m in MODES if m != AUTO), WALL)

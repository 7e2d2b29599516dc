"""The timer names `time_callable` accepts, without importing torch (the CLI's --timer choices).

``auto`` picks ``cuda_graph`` on a GPU and ``wall`` on the CPU; the others are
described in `treebench.harness.timing.timers`. ``wall`` is not a mode one asks
for: it is the CPU's only timer, and a CUDA timer asked for on the CPU falls back to it.
"""

MODES = ("auto", "cuda_graph", "cuda_event", "host_inclusive", "cuda_graph_loop")
WALL = "wall"   # the CPU's timer, as rows record it

"""A Triton kernel launch with every argument fixed at prepare time.

`kernel[grid](...)` re-binds arguments, recomputes the specialisation key and
looks up the compiled kernel on every call: about 40 us of host time per
launch with Triton 3.6 (measured on the H200 host; lab/runs.md). A
`FixedLaunch` makes that ordinary launch once, then may replay through the
compiled kernel's own launcher with the argument values captured (tensors as
raw device pointers), which leaves only the driver call. The replay relies on
the launcher's calling convention (`CompiledKernel.run(grid0, grid1, grid2,
stream, function, packed_metadata, launch_metadata, enter_hook, exit_hook,
*all_parameters)`, Triton 3.3 to 3.9), so `verify_fast_path` checks it against
the ordinary launch and falls back when it differs. Neither path allocates or
syncs: both are CUDA-graph capturable. Launch hooks (profilers) are bypassed
on the fast path.
"""

from __future__ import annotations

import inspect

import logging
from collections.abc import Callable, Sequence

import torch
import triton

log = logging.getLogger(__name__)


class FixedLaunch:
    """One kernel launch: `kernel[grid](*args, **consts, **options)`, callable with no arguments."""

    def __init__(self, kernel, grid: tuple[int, ...], args: list, consts: dict, options: dict):
        self.kernel, self.args, self.consts, self.options = kernel, args, consts, options
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self._fast: tuple | None = None   # (compiled kernel, device index, parameter values)

    def __call__(self) -> None:
        if self._fast is None:
            self.kernel[self.grid](*self.args, **self.consts, **self.options)
            return
        compiled, device, values = self._fast
        stream = triton.runtime.driver.active.get_current_stream(device)
        compiled.run(self.grid[0], self.grid[1], self.grid[2], stream, compiled.function,
                     compiled.packed_metadata, None, None, None, *values)

    def arm_fast_path(self) -> bool:
        """Captures the compiled kernel and its parameter values (one ordinary launch);
        False where there is none (the CPU interpreter)."""
        compiled = self.kernel[self.grid](*self.args, **self.consts, **self.options)
        if compiled is None or not hasattr(compiled, "packed_metadata"):
            return False
        # parameters left at their defaults (constexprs a launch does not pass) keep them
        defaults = {n: p.default for n, p in inspect.signature(self.kernel.fn).parameters.items()
                    if p.default is not inspect.Parameter.empty}
        named = defaults | dict(zip(self.kernel.arg_names, self.args)) | self.consts
        values = [v.data_ptr() if isinstance(v, torch.Tensor) else v for v in (named[n] for n in self.kernel.arg_names)]
        self._fast = (compiled, self.args[0].device.index, values)
        return True

    def disarm(self) -> None:
        self._fast = None


def verify_fast_path(launches: Sequence[FixedLaunch], run: Callable[[], torch.Tensor]) -> bool:
    """Arms every launch's fast path and keeps it only if `run()` (all launches)
    reproduces the ordinary launches' output bit for bit.

    Args:
        launches: the launches `run` makes, in order.
        run: launches them all and returns the output buffer.
    """
    expect = run().clone()
    if not all(launch.arm_fast_path() for launch in launches):
        for launch in launches:
            launch.disarm()
        return False
    out = run()
    out.fill_(float("nan"))
    try:
        ok = bool(torch.equal(run(), expect))
    except (TypeError, ValueError, RuntimeError) as e:   # a launcher of another Triton version
        log.info("compiled-launcher fast path off: %s", e)
        ok = False
    if not ok:
        for launch in launches:
            launch.disarm()
        run()
    return ok

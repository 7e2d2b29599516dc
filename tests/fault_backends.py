"""Fake backends that fail the way real kernels do, for the isolation, resume and
determinism tests (CPU only). None registers itself; load them by path, e.g.
``--backend tests/fault_backends.py:Hangs``.

Each answers with the exact reference (cast to the case dtype) unless its fault
says otherwise, so every non-faulty row passes.
"""

from __future__ import annotations

import os
import signal
import time

import torch

from treebench.harness.adapter.contract import Capabilities
from treebench.harness.model.reference import paged_reference_attention as reference_attention

HANG_MARK_ENV = "TREEBENCH_TEST_HANG_MARK"  # Hangs writes its pid to this file before it hangs
SLOW_ENV = "TREEBENCH_TEST_SLOW_S"  # Slow's untimed setup in seconds (default 0.3), read at each prepare()


class Exact:
    """Correct: the float64 reference in the case dtype."""

    name = "exact"
    mask_kind = "tree"
    capabilities = Capabilities()

    def availability(self):
        return None

    def supports(self, case):
        return None

    def answer(self, inputs) -> torch.Tensor:
        """(sum T_b, Hq, D) in inputs.dtype."""
        return reference_attention(inputs).to(inputs.dtype)

    def prepare(self, inputs):
        out = self.answer(inputs)
        return lambda: out.clone()


class Raises(Exact):
    name = "raises"

    def prepare(self, inputs):
        raise RuntimeError("kernel launch failed: too many resources requested")


class WrongShape(Exact):
    name = "wrong_shape"

    def prepare(self, inputs):
        out = self.answer(inputs)
        return lambda: out[:, :-1]


class WrongDtype(Exact):
    name = "wrong_dtype"

    def prepare(self, inputs):
        out = self.answer(inputs).double()
        return lambda: out


class Hangs(Exact):
    """Never returns (a kernel spinning forever); first touches the file named by $HANG_MARK_ENV, if set."""

    name = "hangs"

    def prepare(self, inputs):
        if os.environ.get(HANG_MARK_ENV):
            with open(os.environ[HANG_MARK_ENV], "w") as f:
                f.write(str(os.getpid()))
        time.sleep(3600)


class ExitsHard(Exact):
    """The process exits under the harness (a library calling exit())."""

    name = "exits_hard"

    def prepare(self, inputs):
        os._exit(7)


class Segfaults(Exact):
    """The process dies of SIGSEGV (a C extension reading a wild pointer)."""

    name = "segfaults"

    def prepare(self, inputs):
        os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(60)


class Aborts(Exact):
    """The process aborts (SIGABRT: a C++ library's failed assertion calls abort())."""

    name = "aborts"

    def prepare(self, inputs):
        os.abort()


class SegfaultsInSupports(Exact):
    """The process dies of SIGSEGV before the pair enters a step: in supports()."""

    name = "segfaults_in_supports"

    def supports(self, case):
        os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(60)


class HangsInSupports(Exact):
    """Never returns from supports(): hangs before the pair enters a step."""

    name = "hangs_in_supports"

    def supports(self, case):
        time.sleep(3600)


class SegfaultsOnSecondPrepare(Exact):
    """Correct on its first prepare; its second (a check's re-prepare) dies of SIGSEGV."""

    name = "segfaults_on_second_prepare"
    prepares = 0

    def prepare(self, inputs):
        self.prepares += 1
        if self.prepares > 1:
            os.kill(os.getpid(), signal.SIGSEGV)
            time.sleep(60)
        return super().prepare(inputs)


class HangsWhenTimed(Exact):
    """Its first call answers correctly; every later one (a run's timed calls) never returns."""

    name = "hangs_when_timed"

    def prepare(self, inputs):
        out, calls = self.answer(inputs), []

        def call():
            calls.append(1)
            if len(calls) > 1:
                time.sleep(3600)
            return out.clone()
        return call


class LosesContext(Exact):
    """Raises the error a sticky illegal memory access gives, as torch words it."""

    name = "loses_context"

    def prepare(self, inputs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be ...")


class Slow(Exact):
    """Correct, with $TREEBENCH_TEST_SLOW_S seconds of untimed setup: a sweep long enough to be killed mid-way."""

    name = "slow"

    def prepare(self, inputs):
        time.sleep(float(os.environ.get(SLOW_ENV, "0.3")))
        return super().prepare(inputs)


class Twin(Exact):
    """Correct; a second, differently named correct backend."""

    name = "twin"


class PersistentBuffer(Exact):
    """Deterministic, and returns the same output buffer on every call (as a planned kernel does)."""

    name = "persistent_buffer"

    def prepare(self, inputs):
        ref = self.answer(inputs)
        buf = torch.empty_like(ref)

        def run():
            buf.copy_(ref)
            return buf

        return run


class Nondeterministic(PersistentBuffer):
    """Right within tolerance, but the last bit of one element changes from call to call (as an
    atomic-add reduction's does), written into one persistent buffer so that a check which
    forgets to copy the first output misses it."""

    name = "nondeterministic"

    def prepare(self, inputs):
        ref = self.answer(inputs)
        buf = torch.empty_like(ref)
        as_int = {2: torch.int16, 4: torch.int32, 8: torch.int64}[ref.element_size()]
        calls = [0]

        def run():
            calls[0] += 1
            buf.copy_(ref)
            bits = buf.view(as_int).view(-1)
            bits[0] ^= calls[0] % 2   # one ulp on odd calls: inside every dtype's tolerance
            return buf

        return run


class Unavailable(Exact):
    """Never available: every pair a skipped row."""

    name = "unavailable"

    def availability(self):
        return "never available (a test backend)"

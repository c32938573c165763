"""Settings shared by the fuzz tests: example counts from the environment, CI-sized by default.

``TESSERA_FUZZ_EXAMPLES=N`` sets the number of examples of every property test (the CI default is
small, see each test's ``ci=``) and draws fresh random cases; without it hypothesis is derandomized,
so the CI run tries the same cases every time and never flakes on a new draw.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

_ENV = os.environ.get("TESSERA_FUZZ_EXAMPLES", "").strip()

#: Cases tried by each property test in this run (the tests add theirs here; see the conftest report).
TRIED: dict[str, int] = {}


def fuzz_settings(ci: int):
    """hypothesis settings: ``ci`` examples (or ``$TESSERA_FUZZ_EXAMPLES``), no deadline, no database."""
    examples = int(_ENV) if _ENV else ci
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=not _ENV,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
        print_blob=True,
        # CI: report a failure at once (shrinking recompiles hundreds of kernels); long runs shrink.
        phases=list(Phase) if _ENV else [Phase.explicit, Phase.reuse, Phase.generate],
    )


def count(test: str) -> None:
    TRIED[test] = TRIED.get(test, 0) + 1

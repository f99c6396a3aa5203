"""The benchmarks' tests start outside any task attempt too: the suite's autouse fixture applies here."""

from tests.conftest import no_inherited_attempt_number

__all__ = ["no_inherited_attempt_number"]

"""Modification times as stores report them become aware datetimes (garbage collection needs them)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from flyte_checkpoint.storage.base import modified_time

UTC = timezone.utc


@pytest.mark.parametrize(
    ("reported", "expected"),
    [
        ("2026-12-04T15:27:12.66271Z", datetime(2026, 12, 4, 15, 27, 12, 662710, tzinfo=UTC)),  # fake-gcs
        ("2026-12-04T15:27:12.021Z", datetime(2026, 12, 4, 15, 27, 12, 21000, tzinfo=UTC)),  # GCS
        ("2026-12-04T15:27:12.123456789+00:00", datetime(2026, 12, 4, 15, 27, 12, 123456, tzinfo=UTC)),
        ("2026-12-04T15:27:12Z", datetime(2026, 12, 4, 15, 27, 12, tzinfo=UTC)),
        (datetime(2026, 12, 4, 15, 27, 12), datetime(2026, 12, 4, 15, 27, 12, tzinfo=UTC)),
        (datetime(2026, 12, 4, 15, 27, 12, tzinfo=UTC), datetime(2026, 12, 4, 15, 27, 12, tzinfo=UTC)),
        ("yesterday", None),
        (None, None),
        (1764861000, None),
    ],
)
def test_reported_times_become_aware_datetimes(reported: object, expected: datetime | None) -> None:
    assert modified_time(reported) == expected

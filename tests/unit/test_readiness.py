"""What `/readyz` answers (app.not_ready): with the webhook, whether it answers, leading or
standing by, caches synced or not (the webhook Service's endpoints follow it); without, the
controller's own state; shutting down, never ready."""

from __future__ import annotations

import pytest

from gangcheck.app import not_ready


@pytest.mark.parametrize(
    ("draining", "webhook_serving", "standing_by", "serving", "expected"),
    [
        # with the webhook: its own state only
        (False, True, False, False, ""),  # the leader's caches syncing: reviews still answered
        (False, True, True, False, ""),  # standing by
        (False, True, False, True, ""),
        (False, False, False, True, "the webhook is not serving"),
        (False, False, True, False, "the webhook is not serving"),
        # without: standing by, or the leader's caches synced
        (False, None, True, False, ""),
        (False, None, False, True, ""),
        (False, None, False, False, "caches not synced"),
        # shutting down (SIGTERM): NotReady at once, the webhook still answering a while
        (True, True, False, True, "shutting down"),
        (True, None, True, True, "shutting down"),
    ],
)
def test_not_ready(
    draining: bool, webhook_serving: bool | None, standing_by: bool, serving: bool, expected: str
) -> None:
    assert (
        not_ready(
            draining=draining,
            webhook_serving=webhook_serving,
            standing_by=standing_by,
            serving=serving,
        )
        == expected
    )

"""Domain retries as arithmetic: Kueue's requeue backoff for a check set to Retry."""

from __future__ import annotations


def requeue_after_seconds(retry_count: int, *, base_seconds: int, max_seconds: int) -> int:
    """Seconds Kueue waits before requeueing after the (retry_count+1)-th Retry.

    Kueue computes base * 2^(n-1) capped at max, where n = retryCount + 1 (the Retry being
    set now); its jitter is negligible (factor 1e-4) and left out so the result is exact.
    """
    n = retry_count + 1
    if n - 1 >= max_seconds.bit_length():  # 2^(n-1) alone exceeds max_seconds (base >= 1)
        return max_seconds  # without 2 ** (n-1): a hand-written attempt may be huge
    return int(min(base_seconds * 2 ** (n - 1), max_seconds))


def may_retry(attempt: int, *, limit: int) -> bool:
    """Kueue's rule: attempt n may be retried while n <= backoffLimitCount."""
    return attempt <= limit

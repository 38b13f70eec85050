"""Generated names are valid for their kind and unique per attempt, for any valid input name.

Property tests (hypothesis) over valid Workload names (DNS subdomains up to 253 characters,
dots anywhere, near the cut too), check names (DNS labels up to 63) and pod set names.
"""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from gangcheck.logic.attempt import naming

SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def is_subdomain(name: str) -> bool:
    return len(name) <= 253 and SUBDOMAIN.fullmatch(name) is not None


ALNUM = "abcdefghijklmnopqrstuvwxyz0123456789"
middles = st.one_of(
    st.text("-." + ALNUM[:3], max_size=61).map(lambda s: s.replace(".", "")),
    st.integers(min_value=0, max_value=61).map(lambda n: "a" * n),
)
labels = st.builds(
    lambda first, middle, last: first + middle + last, st.sampled_from(ALNUM), middles, st.just("")
).map(lambda s: s.rstrip("-") or "a")
"""A DNS label (up to 63 characters)."""
subdomains = st.builds(
    lambda parts, cut: ((".".join(parts) + ".") * 253)[:cut].rstrip("-.") or "a",
    st.lists(labels, min_size=1, max_size=8),
    st.one_of(st.integers(min_value=1, max_value=253), st.integers(min_value=230, max_value=253)),
)
"""A valid DNS subdomain, often long, with dots at any position (near the cut too)."""


def dotted_at(cut: int, length: int) -> str:
    """A Workload name of `length` with a dot at index `cut`."""
    return "w" * cut + "." + "x" * (length - cut - 1)


@settings(max_examples=300)
@given(workload=subdomains, check=labels, attempts=st.integers(min_value=1, max_value=40))
def test_request_names_are_subdomains_unique_per_attempt(
    workload: str, check: str, attempts: int
) -> None:
    names = [naming.request_name(workload, check, a) for a in range(1, attempts + 1)]
    assert all(is_subdomain(n) for n in names), names
    assert len(set(names)) == attempts
    assert [naming.attempt_of(n, workload, check) for n in names] == list(range(1, attempts + 1))


@settings(max_examples=300)
@given(workload=subdomains, check=labels, pod_sets=st.lists(labels, min_size=1, max_size=4))
def test_template_names_are_subdomains_unique_per_attempt_and_pod_set(
    workload: str, check: str, pod_sets: list[str]
) -> None:
    names = {
        (attempt, ps): naming.template_name(naming.request_name(workload, check, attempt), ps)
        for attempt in (1, 2, 3)
        for ps in set(pod_sets)
    }
    assert all(is_subdomain(n) for n in names.values()), names
    assert len(set(names.values())) == len(names)


@settings(max_examples=200)
@given(obj=subdomains, token=st.text("0123456789abcdef", min_size=16, max_size=16))
def test_event_names_are_subdomains(obj: str, token: str) -> None:
    assert is_subdomain(naming.event_name(obj, token))


def test_a_dot_at_every_cut_position_still_makes_valid_names() -> None:
    for cut in range(1, 252):
        workload = dotted_at(cut, 253)
        request = naming.request_name(workload, "atomic-provisioning-check", 1)
        assert is_subdomain(request), (cut, request)
        assert is_subdomain(naming.template_name(request, "workers")), cut


def test_short_names_are_kueues() -> None:
    assert naming.request_name("wl", "atomic", 3) == "wl-atomic-3"
    assert naming.template_name("wl-atomic-3", "workers") == "ppt-wl-atomic-3-workers"

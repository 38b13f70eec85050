"""The proxy variables are read once, when the client connects: a proxy named there carries
every request, NO_PROXY keeps the API server direct, and a variable changed later changes
nothing (aiohttp would otherwise look them up, and ~/.netrc, in a thread for each request)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from aiohttp import web

from gangcheck.kube.client import Kube

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy")


async def _serve(answer: str) -> tuple[web.AppRunner, str]:
    async def anything(_: web.Request) -> web.Response:
        return web.json_response({"via": answer})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", anything)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


@pytest.fixture
async def servers() -> AsyncIterator[tuple[str, str]]:
    """An API server and a forward proxy (it answers every request itself), both plain HTTP."""
    api, api_url = await _serve("direct")
    proxy, proxy_url = await _serve("proxy")
    try:
        yield api_url, proxy_url
    finally:
        await api.cleanup()
        await proxy.cleanup()


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def _kubeconfig(path: Path, server: str) -> str:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path.write_text(yaml.safe_dump(config))
    return str(path)


async def _via(kubeconfig: str, monkeypatch: pytest.MonkeyPatch, later: dict[str, str]) -> str:
    async with await Kube.connect(kubeconfig, retry_attempts=1) as kube:
        for name, value in later.items():
            monkeypatch.setenv(name, value)
        return str((await kube.request("GET", "/version"))["via"])


@pytest.mark.parametrize(
    ("at_connect", "later", "expected"),
    [
        ({}, {}, "direct"),
        ({"HTTP_PROXY": "{proxy}"}, {}, "proxy"),
        ({"http_proxy": "{proxy}"}, {}, "proxy"),
        ({"HTTP_PROXY": "{proxy}", "NO_PROXY": "127.0.0.1"}, {}, "direct"),
        # read once: a proxy named after the client connected is not used, nor one removed
        ({}, {"HTTP_PROXY": "{proxy}"}, "direct"),
        ({"HTTP_PROXY": "{proxy}"}, {"NO_PROXY": "127.0.0.1"}, "proxy"),
    ],
)
async def test_the_proxy_variables_are_read_once_at_connect(
    servers: tuple[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    at_connect: dict[str, str],
    later: dict[str, str],
    expected: str,
) -> None:
    api, proxy = servers
    for name, value in at_connect.items():
        monkeypatch.setenv(name, value.format(proxy=proxy))
    later = {name: value.format(proxy=proxy) for name, value in later.items()}
    kubeconfig = _kubeconfig(tmp_path / "kubeconfig", api)
    assert await _via(kubeconfig, monkeypatch, later) == expected

"""Every request the API client sends is counted with what it was answered, each try of a
retried one included (a 429 the client waited out and sent again is seen, not only the errors
a reconcile ended with), and a request that got no answer as code 0."""

from __future__ import annotations

import socket
from pathlib import Path

from aiohttp import web

from gangcheck.kube.client import Kube
from gangcheck.kube.errors import TransientError
from gangcheck.telemetry import Metrics
from tests.unit.test_kube_proxy_env import _kubeconfig


def _counted(metrics: Metrics) -> dict[tuple[str, str], float]:
    """gangcheck_api_requests_total's series as served: (method, code) -> count."""
    out: dict[tuple[str, str], float] = {}
    for line in metrics.render().splitlines():
        if not line.startswith("gangcheck_api_requests_total{"):
            continue
        labels, value = line[len("gangcheck_api_requests_total{") :].split("} ")
        pairs = dict(p.split("=", 1) for p in labels.split(","))
        out[(pairs["method"].strip('"'), pairs["code"].strip('"'))] = float(value)
    return out


async def test_each_try_is_counted_with_its_answer(tmp_path: Path) -> None:
    tries = {"busy": 0}

    async def busy_once(_: web.Request) -> web.Response:
        tries["busy"] += 1
        if tries["busy"] == 1:
            return web.json_response(
                {"kind": "Status", "code": 429, "reason": "TooManyRequests"},
                status=429,
                headers={"Retry-After": "0"},
            )
        return web.json_response({"kind": "Thing"})

    async def created(_: web.Request) -> web.Response:
        return web.json_response({"kind": "Thing"}, status=201)

    app = web.Application()
    app.router.add_get("/busy", busy_once)
    app.router.add_post("/things", created)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    metrics = Metrics()
    try:
        config = _kubeconfig(tmp_path / "kubeconfig", url)
        async with await Kube.connect(config, retry_attempts=3) as plain:
            kube = plain.observed(metrics.api_request)
            assert (await kube.request("GET", "/busy"))["kind"] == "Thing"
            await kube.request("POST", "/things", body={"kind": "Thing"})
    finally:
        await runner.cleanup()
    assert _counted(metrics) == {("GET", "429"): 1, ("GET", "200"): 1, ("POST", "201"): 1}


async def test_no_answer_is_counted_as_code_0(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    metrics = Metrics()
    config = _kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{port}")
    async with await Kube.connect(config, retry_attempts=2, retry_seconds=5) as plain:
        kube = plain.observed(metrics.api_request).fenced(lambda: 10.0)
        try:
            await kube.request("GET", "/anything")
        except TransientError as e:
            assert e.status == 0
        else:
            raise AssertionError("a request to a closed port was answered")
    assert _counted(metrics) == {("GET", "0"): 2}

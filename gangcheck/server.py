"""Health, readiness and metrics over HTTP (aiohttp): what the kubelet and Prometheus read."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from gangcheck.telemetry import Metrics

EXPOSITION_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The Prometheus text format's media type, its version said (a scraper picks its parser by
it; Prometheus 3 refuses a scrape whose type it cannot place)."""


class HealthServer:
    """`/healthz` and `/readyz` on one port, `/metrics` on another (0 picks a free port).
    `ready()` says why the process is not ready ("" when it is): `/readyz` answers 503 with
    it."""

    def __init__(
        self,
        *,
        metrics: Metrics,
        ready: Callable[[], str],
        bind_address: str = "0.0.0.0",
        health_port: int = 8081,
        metrics_port: int = 8080,
    ) -> None:
        self._metrics = metrics
        self._ready = ready
        self._bind = bind_address
        self._ports = {"health": health_port, "metrics": metrics_port}
        self._runners: list[web.AppRunner] = []
        self.ports: dict[str, int] = {}

    async def start(self) -> None:
        health = web.Application()
        health.router.add_get("/healthz", self._healthz)
        health.router.add_get("/readyz", self._readyz)
        metrics = web.Application()
        metrics.router.add_get("/metrics", self._render_metrics)
        for name, app in (("health", health), ("metrics", metrics)):
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, self._bind, self._ports[name])
            await site.start()
            self._runners.append(runner)
            self.ports[name] = runner.addresses[0][1]

    async def stop(self) -> None:
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _readyz(self, _: web.Request) -> web.Response:
        why = self._ready()
        if not why:
            return web.Response(text="ok")
        return web.Response(status=503, text=why)

    async def _render_metrics(self, _: web.Request) -> web.Response:
        return web.Response(
            body=self._metrics.render().encode(), headers={"Content-Type": EXPOSITION_TYPE}
        )

"""A kubeconfig with embedded TLS material works where no temporary file can be written (the
image's read-only root without /tmp): the CA, client certificate and key stay in memory."""

from __future__ import annotations

import asyncio
import base64
import ssl
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from aiohttp import web
from gangcheck_dev.testbed.certs import CertificateAuthority

from gangcheck.kube.client import Kube, KubeconfigError


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture
def no_temp_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Every temporary file this process would make goes to a folder that does not exist."""
    missing = tmp_path / "no-such-folder"
    monkeypatch.setenv("TMPDIR", str(missing))
    monkeypatch.setattr(tempfile, "tempdir", str(missing))
    return missing


@pytest.fixture
async def tls_server(tmp_path: Path) -> AsyncIterator[tuple[str, CertificateAuthority]]:
    """An HTTPS server on 127.0.0.1 answering /version to clients with a certificate of its CA."""
    ca = CertificateAuthority.create("in-memory-test-ca")
    serving = ca.issue_serving("127.0.0.1", ips=["127.0.0.1"])
    serving.write(tmp_path / "tls.crt", tmp_path / "tls.key")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cadata=ca.cert_pem.decode())
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")

    async def version(_: web.Request) -> web.Response:
        return web.json_response({"gitVersion": "v1.37.2"})

    app = web.Application()
    app.router.add_get("/version", version)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"https://127.0.0.1:{port}", ca
    finally:
        await runner.cleanup()


def _kubeconfig(path: Path, server: str, ca: CertificateAuthority) -> Path:
    client = ca.issue_client("tester")
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "c",
                "cluster": {"server": server, "certificate-authority-data": _b64(ca.cert_pem)},
            }
        ],
        "users": [
            {
                "name": "u",
                "user": {
                    "client-certificate-data": _b64(client.cert_pem),
                    "client-key-data": _b64(client.key_pem),
                },
            }
        ],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }
    path.write_text(yaml.safe_dump(config))
    return path


async def test_embedded_ca_and_client_certificate_need_no_temporary_file(
    tmp_path: Path, no_temp_dir: Path, tls_server: tuple[str, CertificateAuthority]
) -> None:
    server, ca = tls_server
    kubeconfig = _kubeconfig(tmp_path / "kubeconfig", server, ca)
    with pytest.raises(OSError):
        tempfile.mkstemp()  # the simulated image: no temporary file can be made
    async with await Kube.connect(str(kubeconfig)) as kube:
        assert await kube.request("GET", "/version") == {"gitVersion": "v1.37.2"}
    assert not await asyncio.to_thread(no_temp_dir.exists)


async def test_the_kubeconfig_file_is_left_as_it_was(
    tmp_path: Path, no_temp_dir: Path, tls_server: tuple[str, CertificateAuthority]
) -> None:
    server, ca = tls_server
    kubeconfig = _kubeconfig(tmp_path / "kubeconfig", server, ca)
    before = await asyncio.to_thread(kubeconfig.read_text)
    async with await Kube.connect(str(kubeconfig)):
        pass
    assert await asyncio.to_thread(kubeconfig.read_text) == before


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "kubeconfig {path} not found"),
        ("clusters: [\n", "cannot load the kubeconfig {path}"),
        ("apiVersion: v1\nkind: Config\n", "cannot load the kubeconfig {path}"),
    ],
    ids=["missing file", "not YAML", "no current context"],
)
async def test_an_unusable_kubeconfig_is_one_error_of_ours(
    tmp_path: Path, content: str | None, says: str
) -> None:
    path = tmp_path / "kubeconfig"
    if content is not None:
        path.write_text(content)
    with pytest.raises(KubeconfigError) as raised:
        await Kube.connect(str(path))
    assert says.format(path=path) in str(raised.value)
    assert "\n" not in str(raised.value)


async def test_in_cluster_outside_a_cluster_is_one_error_of_ours(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubeconfigError, match="cannot use the in-cluster configuration"):
        await Kube.connect(in_cluster=True)

"""`sudo make kueue-metrics-cert`: the one step as root that lets stacks with Kueue start as any
user (Kueue v0.17 reads its metrics certificate from a fixed folder). Run here into a folder of
the test's own (KUEUE_METRICS_CERTS), never /etc/kueue, which running stacks share."""

from __future__ import annotations

import ipaddress
import os
import stat
import subprocess
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

REPO = Path(__file__).resolve().parents[3]


def _make(folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            "make",
            "-s",
            "--no-print-directory",
            "kueue-metrics-cert",
            f"KUEUE_METRICS_CERTS={folder}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )


def test_kueue_metrics_cert_writes_a_pair_any_user_can_read(tmp_path: Path) -> None:
    folder = tmp_path / "etc" / "kueue" / "metrics" / "certs"
    result = _make(folder)
    if os.geteuid() != 0:
        assert result.returncode != 0
        assert "needs root: sudo make kueue-metrics-cert" in result.stderr
        assert not folder.exists()
        return
    assert result.returncode == 0, result.stderr
    cert = x509.load_pem_x509_certificate((folder / "tls.crt").read_bytes())
    key = serialization.load_pem_private_key((folder / "tls.key").read_bytes(), password=None)
    assert cert.public_key() == key.public_key()
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in names.get_values_for_type(x509.IPAddress)
    for name in ("tls.crt", "tls.key"):
        assert (folder / name).stat().st_mode & stat.S_IROTH, f"{name} not readable by others"

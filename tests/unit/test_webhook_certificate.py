"""The webhook's serving certificate read for its validity (gangcheck/webhook.py): an expired
or not yet valid certificate is refused by kube-apiserver, so every pod goes through ungated;
the webhook says so in its log instead of serving it silently."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gangcheck.webhook import CertificateFiles, certificate_validity

NOW = datetime(2026, 12, 6, 9, 0, tzinfo=UTC)


def pair(not_before: datetime, not_after: datetime) -> tuple[bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gangcheck-webhook")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


@pytest.mark.parametrize(
    ("not_before", "not_after"),
    [
        pytest.param(NOW - timedelta(days=1), NOW + timedelta(days=90), id="UTCTime"),
        pytest.param(
            datetime(2049, 12, 31, 23, 59, 59, tzinfo=UTC),
            datetime(2061, 1, 2, 3, 4, 5, tzinfo=UTC),
            id="GeneralizedTime from 2050",
        ),
    ],
)
def test_certificate_validity_reads_both_times(not_before: datetime, not_after: datetime) -> None:
    cert, _ = pair(not_before, not_after)
    assert certificate_validity(cert) == (not_before, not_after)


@pytest.mark.parametrize(
    "pem",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"not a certificate", id="text"),
        pytest.param(
            b"-----BEGIN CERTIFICATE-----\nMAMCAQA=\n-----END CERTIFICATE-----\n", id="short DER"
        ),
        pytest.param(b"-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n", id="b64"),
    ],
)
def test_certificate_validity_of_what_is_no_certificate_is_none(pem: bytes) -> None:
    assert certificate_validity(pem) is None


def files(tmp_path: Path, not_before: datetime, not_after: datetime) -> tuple[Path, Path]:
    cert, key = pair(not_before, not_after)
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    return tmp_path / "tls.crt", tmp_path / "tls.key"


CASES = [
    pytest.param(
        NOW - timedelta(days=90),
        NOW - timedelta(hours=1),
        "webhook certificate {cert} expired at 2026-12-06T08:00:00Z: kube-apiserver refuses "
        "it, so pods are created ungated until it is renewed",
        id="expired",
    ),
    pytest.param(
        NOW + timedelta(hours=2),
        NOW + timedelta(days=90),
        "webhook certificate {cert} is not valid before 2026-12-06T11:00:00Z: kube-apiserver "
        "refuses it, so pods are created ungated until then",
        id="not yet valid",
    ),
]


@pytest.mark.parametrize(("not_before", "not_after", "said"), CASES)
def test_a_certificate_out_of_its_validity_is_loaded_and_said(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    not_before: datetime,
    not_after: datetime,
    said: str,
) -> None:
    cert, key = files(tmp_path, not_before, not_after)
    loaded = CertificateFiles(cert, key, interval=0, clock=lambda: NOW)
    with caplog.at_level(logging.WARNING, logger="gangcheck.webhook"):
        loaded.refresh()
        loaded.refresh()  # said once, not at every handshake
    assert loaded.context is not None  # served all the same: the previous is no better
    assert [r.getMessage() for r in caplog.records] == [said.format(cert=cert)]


def test_a_certificate_that_expires_while_served_is_said_when_it_does(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    now = [NOW]
    cert, key = files(tmp_path, NOW - timedelta(days=1), NOW + timedelta(minutes=5))
    loaded = CertificateFiles(cert, key, interval=0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="gangcheck.webhook"):
        loaded.refresh()
        assert caplog.records == []
        now[0] = NOW + timedelta(minutes=6)
        loaded.refresh()
        loaded.refresh()
    assert [r.getMessage() for r in caplog.records] == [
        f"webhook certificate {cert} expired at 2026-12-06T09:05:00Z: kube-apiserver refuses "
        "it, so pods are created ungated until it is renewed"
    ]

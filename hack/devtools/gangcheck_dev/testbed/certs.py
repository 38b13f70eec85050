"""Certificates of the local control plane: a CA, the apiserver's serving cert, client certs.

Everything is generated fresh per control plane with ``cryptography``; nothing is reused
between runs. TLS keys are ECDSA P-256 (fast to generate); the service-account signing key is
RSA, the key type every Kubernetes component accepts.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=365)
CLOCK_SKEW = datetime.timedelta(hours=1)

#: Names the apiserver answers to: loopback plus the in-cluster names of the ``kubernetes``
#: Service (whose ClusterIP is the first address of ``--service-cluster-ip-range``).
APISERVER_IPS = ("127.0.0.1", "10.0.0.1")
APISERVER_DNS_NAMES = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
ADMIN_USER = "gangcheck-admin"
ADMIN_GROUP = "system:masters"
#: The apiserver's identity towards aggregated APIs (front proxy), as kubeadm names it. Without
#: a request-header CA every component with delegated authentication (kube-scheduler,
#: kube-controller-manager) logs "missing content for CA bundle ... requestheader-client-ca-file".
FRONT_PROXY_USER = "front-proxy-client"


@dataclass(frozen=True)
class KeyPair:
    """A PEM certificate and its PEM (PKCS#8, unencrypted) private key."""

    cert_pem: bytes
    key_pem: bytes

    def write(self, cert_path: Path, key_path: Path) -> None:
        cert_path.write_bytes(self.cert_pem)
        _write_private(key_path, self.key_pem)


def _write_private(path: Path, data: bytes) -> None:
    path.touch(mode=0o600)
    path.write_bytes(data)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common_name: str, organizations: Sequence[str] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + VALIDITY)
    )


def _leaf_usage() -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=False,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )


@dataclass(frozen=True)
class CertificateAuthority:
    """A self-signed CA that signs the control plane's serving and client certificates."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @classmethod
    def create(cls, common_name: str = "gangcheck-testbed-ca") -> CertificateAuthority:
        key = _new_key()
        name = _name(common_name)
        usage = x509.KeyUsage(
            digital_signature=True,
            content_commitment=False,
            key_encipherment=False,
            data_encipherment=False,
            key_agreement=False,
            key_cert_sign=True,
            crl_sign=True,
            encipher_only=False,
            decipher_only=False,
        )
        cert = (
            _builder(name, name, key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(usage, critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .sign(key, hashes.SHA256())
        )
        return cls(cert=cert, key=key)

    @classmethod
    def load(cls, cert_path: Path, key_path: Path) -> CertificateAuthority:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise TypeError(f"{key_path}: expected an ECDSA private key")
        return cls(cert=cert, key=key)

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pair(self) -> KeyPair:
        return KeyPair(cert_pem=self.cert_pem, key_pem=_key_pem(self.key))

    def _sign(
        self,
        subject: x509.Name,
        usage: x509.ObjectIdentifier,
        sans: Sequence[x509.GeneralName] = (),
    ) -> KeyPair:
        key = _new_key()
        builder = (
            _builder(subject, self.cert.subject, key.public_key())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_leaf_usage(), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), False
            )
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), False)
        cert = builder.sign(self.key, hashes.SHA256())
        return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))

    def issue_serving(
        self, common_name: str, ips: Sequence[str] = (), dns_names: Sequence[str] = ()
    ) -> KeyPair:
        """A server certificate valid for the given IP addresses and DNS names."""
        sans: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        sans.extend(x509.DNSName(name) for name in dns_names)
        if not sans:
            raise ValueError("a serving certificate needs at least one IP or DNS name")
        return self._sign(_name(common_name), ExtendedKeyUsageOID.SERVER_AUTH, sans)

    def issue_client(self, user: str, groups: Sequence[str] = ()) -> KeyPair:
        """A client certificate: Kubernetes reads the user from CN and groups from O."""
        return self._sign(_name(user, groups), ExtendedKeyUsageOID.CLIENT_AUTH)


def service_account_key_pair() -> tuple[bytes, bytes]:
    """An RSA key pair for signing service-account tokens: (private PEM, public PEM)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return _key_pem(key), public


@dataclass(frozen=True)
class PKIPaths:
    """Where a control plane's certificates and keys live on disk."""

    directory: Path

    @property
    def ca_cert(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def apiserver_cert(self) -> Path:
        return self.directory / "apiserver.crt"

    @property
    def apiserver_key(self) -> Path:
        return self.directory / "apiserver.key"

    @property
    def admin_cert(self) -> Path:
        return self.directory / "admin.crt"

    @property
    def admin_key(self) -> Path:
        return self.directory / "admin.key"

    @property
    def front_proxy_ca_cert(self) -> Path:
        return self.directory / "front-proxy-ca.crt"

    @property
    def front_proxy_client_cert(self) -> Path:
        return self.directory / "front-proxy-client.crt"

    @property
    def front_proxy_client_key(self) -> Path:
        return self.directory / "front-proxy-client.key"

    @property
    def service_account_key(self) -> Path:
        return self.directory / "sa.key"

    @property
    def service_account_pub(self) -> Path:
        return self.directory / "sa.pub"

    def load_ca(self) -> CertificateAuthority:
        return CertificateAuthority.load(self.ca_cert, self.ca_key)


def write_pki(directory: Path) -> PKIPaths:
    """Generates the CA, apiserver serving cert, admin client cert, front-proxy CA and client
    cert, and service-account keys."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = PKIPaths(directory)
    ca = CertificateAuthority.create()
    ca.key_pair.write(paths.ca_cert, paths.ca_key)
    serving = ca.issue_serving("kube-apiserver", APISERVER_IPS, APISERVER_DNS_NAMES)
    serving.write(paths.apiserver_cert, paths.apiserver_key)
    ca.issue_client(ADMIN_USER, [ADMIN_GROUP]).write(paths.admin_cert, paths.admin_key)
    front_proxy = CertificateAuthority.create("gangcheck-testbed-front-proxy-ca")
    paths.front_proxy_ca_cert.write_bytes(front_proxy.cert_pem)
    front_proxy.issue_client(FRONT_PROXY_USER).write(
        paths.front_proxy_client_cert, paths.front_proxy_client_key
    )
    sa_private, sa_public = service_account_key_pair()
    _write_private(paths.service_account_key, sa_private)
    paths.service_account_pub.write_bytes(sa_public)
    return paths

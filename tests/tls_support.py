"""Test certificates: a CA and certificates it signs (host names and IPs as subject alternative
names), written as PEM (key and chain in one file, as Kafka's PEM keystore) and PKCS12."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import NameOID

PASSWORD = "test-secret"


@dataclass(frozen=True)
class Issued:
    keystore_pem: Path       # private key + certificate chain
    keystore_p12: Path       # the same as PKCS12, with PASSWORD
    certificate_pem: Path    # the certificate alone


@dataclass(frozen=True)
class TestCa:
    directory: Path
    key: ec.EllipticCurvePrivateKey
    certificate: x509.Certificate

    @property
    def pem(self) -> Path:
        return self.directory / "ca.pem"

    def issue(self, name: str, hosts: tuple[str, ...] = ("localhost", "127.0.0.1"),
              key_password: str | None = None) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        sans = [x509.IPAddress(ipaddress.ip_address(h)) if _is_ip(h) else x509.DNSName(h)
                for h in hosts]
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Strata"),
                                         x509.NameAttribute(NameOID.COMMON_NAME, name)]))
                .issuer_name(self.certificate.subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=2))
                .add_extension(x509.SubjectAlternativeName(sans), critical=False)
                .sign(self.key, hashes.SHA256()))
        encryption = (serialization.BestAvailableEncryption(key_password.encode())
                      if key_password else serialization.NoEncryption())
        key_pem = key.private_bytes(serialization.Encoding.PEM,
                                    serialization.PrivateFormat.PKCS8, encryption)
        chain = cert.public_bytes(serialization.Encoding.PEM) + \
            self.certificate.public_bytes(serialization.Encoding.PEM)
        out = Issued(self.directory / f"{name}.keystore.pem", self.directory / f"{name}.p12",
                     self.directory / f"{name}.pem")
        out.keystore_pem.write_bytes(key_pem + chain)
        out.certificate_pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        out.keystore_p12.write_bytes(pkcs12.serialize_key_and_certificates(
            name.encode(), key, cert, [self.certificate],
            serialization.BestAvailableEncryption(PASSWORD.encode())))
        return out


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def make_ca(directory: Path) -> TestCa:
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Strata Test CA")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False,
                                         False), critical=True)
            .sign(key, hashes.SHA256()))
    ca = TestCa(directory, key, cert)
    ca.pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return ca

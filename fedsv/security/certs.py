"""`fedsv certs`: a run's CA, the coordinator's server certificate, per-participant certs and tokens."""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fedsv.fl.ranks import participant_id

logger = logging.getLogger(__name__)

CA_NAME = "fedsv run CA"
COORDINATOR_NAME = "fedsv-coordinator"
DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")
TOKENS_FILE = "tokens.txt"


@dataclass(frozen=True)
class RunCerts:
    """Where `generate` put things (paths inside `out`)."""

    out: Path
    participants: int

    @property
    def ca(self) -> Path:
        return self.out / "ca.pem"

    def participant(self, rank: int) -> tuple[Path, Path]:
        name = participant_id(rank)
        return self.out / f"{name}.pem", self.out / f"{name}.key"


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    _write_secret(path, pem)


def _write_secret(path: Path, data: bytes) -> None:
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.chmod(path, 0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    os.chmod(path, 0o644)


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _issue(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    days: int,
    *,
    ca: bool = False,
    sans: list[x509.GeneralName] | None = None,
    usage: x509.ObjectIdentifier | None = None,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer if not ca else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=not ca,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=ca,
                crl_sign=ca,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    if not ca:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False
        )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


MAX_DAYS = 36_500
"""The longest validity `fedsv certs` writes: a hundred years (X.509 dates end in 9999)."""
MAX_PARTICIPANTS = 2**31 - 1  # the wire's int32 world size


def generate(out: str | Path, participants: int, hosts: list[str] | None = None, days: int = 365) -> RunCerts:
    """Write ca.pem/.key, coordinator.pem/.key, pNNN.pem/.key, pNNN.token and tokens.txt into `out`.

    Participant certificates carry the participant id as CN and as a DNS SAN; the coordinator's
    carries localhost, 127.0.0.1, ::1 and `hosts`. Keys and tokens are written 0600.
    """
    if not 1 <= participants <= MAX_PARTICIPANTS:
        raise ValueError(f"participants must be a whole number in 1..{MAX_PARTICIPANTS}, got {participants}")
    if not 1 <= days <= MAX_DAYS:
        raise ValueError(f"days must be a whole number in 1..{MAX_DAYS} (a hundred years), got {days}")
    target = Path(out)
    if target.exists() and not target.is_dir():
        raise ValueError(f"--out {target} is a file; certificates go into a directory")
    target.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca_cert = _issue(CA_NAME, ca_key, x509.Name([]), ca_key, days, ca=True)
    _write_key(target / "ca.key", ca_key)
    _write_cert(target / "ca.pem", ca_cert)
    names = list(dict.fromkeys([*DEFAULT_HOSTS, *(h.strip() for h in hosts or [] if h.strip())]))
    server_key = _key()
    server_cert = _issue(
        COORDINATOR_NAME,
        server_key,
        ca_cert.subject,
        ca_key,
        days,
        sans=[_san(h) for h in names],
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
    )
    _write_key(target / "coordinator.key", server_key)
    _write_cert(target / "coordinator.pem", server_cert)
    tokens: list[str] = []
    for rank in range(participants):
        name = participant_id(rank)
        key = _key()
        cert = _issue(
            name,
            key,
            ca_cert.subject,
            ca_key,
            days,
            sans=[x509.DNSName(name)],
            usage=ExtendedKeyUsageOID.CLIENT_AUTH,
        )
        _write_key(target / f"{name}.key", key)
        _write_cert(target / f"{name}.pem", cert)
        token = secrets.token_hex(24)
        _write_secret(target / f"{name}.token", (token + "\n").encode())
        tokens.append(f"{name} {token}")
    _write_secret(target / TOKENS_FILE, ("\n".join(tokens) + "\n").encode())
    logger.info("wrote a CA and certificates for %d participants into %s", participants, target)
    return RunCerts(target, participants)


def complete(out: str | Path, participants: int) -> bool:
    """True if `out` already holds the CA, the coordinator's and every participant's cert and key."""
    target = Path(out)
    names = ["ca.pem", "coordinator.pem", "coordinator.key", TOKENS_FILE]
    for rank in range(participants):
        names += [f"{participant_id(rank)}.pem", f"{participant_id(rank)}.key"]
    return all((target / n).is_file() for n in names)


def read_tokens(path: str | Path) -> dict[str, str]:
    """Participant id -> token from a file of `pNNN TOKEN` lines (blank lines and # comments skipped)."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError as exc:
        raise ValueError(f"tokens file {p} does not exist") from exc
    tokens: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2:
            raise ValueError(f"{p}:{number}: expected 'PARTICIPANT_ID TOKEN'")
        if parts[0] in tokens:
            raise ValueError(f"{p}:{number}: {parts[0]} appears twice")
        tokens[parts[0]] = parts[1]
    return tokens

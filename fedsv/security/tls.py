"""gRPC TLS credentials from a `fedsv certs` directory, and the participant id a peer's certificate proves."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from fedsv.fl.ranks import participant_id


def _read(tls_dir: Path, name: str, what: str) -> bytes:
    path = tls_dir / name
    try:
        return path.read_bytes()
    except FileNotFoundError as exc:
        raise ValueError(f"{what} {path} does not exist (create the directory with `fedsv certs`)") from exc
    except PermissionError as exc:
        raise ValueError(f"{what} {path} is not readable") from exc


def _checked_pair(root: Path, name: str, what: str) -> tuple[bytes, bytes]:
    """name.key and name.pem from `root`, parsed: a certificate, a private key, and the key the
    certificate's; anything else is a one-line error naming the file, not a failure to bind later."""
    key_path, cert_path = root / f"{name}.key", root / f"{name}.pem"
    key, cert = _read(root, f"{name}.key", f"{what} key"), _read(root, f"{name}.pem", f"{what} certificate")
    certificates = _certificates(cert_path, cert, f"{what} certificate")
    try:
        private = serialization.load_pem_private_key(key, password=None)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{what} key {key_path} is not an unencrypted PEM private key") from exc
    if private.public_key().public_bytes(*_PUBLIC) != certificates[0].public_key().public_bytes(*_PUBLIC):
        raise ValueError(f"{what} key {key_path} does not belong to the certificate {cert_path}")
    return key, cert


_PUBLIC = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _certificates(path: Path, data: bytes, what: str) -> list[x509.Certificate]:
    try:
        certificates = x509.load_pem_x509_certificates(data)
    except ValueError as exc:
        raise ValueError(f"{what} {path} is not a PEM certificate") from exc
    return certificates


def _ca(root: Path) -> bytes:
    ca = _read(root, "ca.pem", "CA certificate")
    _certificates(root / "ca.pem", ca, "CA certificate")
    return ca


def server_credentials(tls_dir: str | Path, require_client_auth: bool = True) -> grpc.ServerCredentials:
    """The coordinator's TLS credentials: coordinator.pem/.key; with client auth, clients must present a
    certificate that ca.pem signed (mutual TLS)."""
    root = Path(tls_dir)
    key, cert = _checked_pair(root, "coordinator", "coordinator")
    ca = _ca(root) if require_client_auth else None
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=require_client_auth
    )


def channel_credentials(tls_dir: str | Path, rank: int) -> tuple[grpc.ChannelCredentials, bool]:
    """A rank's channel credentials: trust ca.pem; present pNNN.pem/.key when the directory has them.

    Returns (credentials, mutual): mutual is True when the rank presents its own certificate.
    """
    root = Path(tls_dir)
    ca = _ca(root)
    name = participant_id(rank)
    cert_path, key_path = root / f"{name}.pem", root / f"{name}.key"
    if cert_path.exists() != key_path.exists():
        raise ValueError(f"{root} must hold both {name}.pem and {name}.key, or neither")
    if not cert_path.exists():
        return grpc.ssl_channel_credentials(root_certificates=ca), False
    key, cert = _checked_pair(root, name, name)
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert), True


def rank_token(tls_dir: str | Path, rank: int) -> str:
    """The rank's participant token from pNNN.token in `tls_dir`, or "" when there is none."""
    path = Path(tls_dir) / f"{participant_id(rank)}.token"
    return path.read_text().strip() if path.is_file() else ""


def peer_identity(auth_context: Mapping[str, Sequence[bytes]]) -> str | None:
    """The common name of a TLS peer's verified client certificate, or None (no TLS, or no client cert)."""
    names = auth_context.get("x509_common_name") or []
    if len(names) != 1:
        return None
    try:
        return names[0].decode("ascii")
    except UnicodeDecodeError:
        return None

"""gRPC TLS credentials from a `fedsv certs` directory, and the participant id a peer's certificate proves."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import grpc

from fedsv.fl.ranks import participant_id


def _read(tls_dir: Path, name: str, what: str) -> bytes:
    path = tls_dir / name
    try:
        return path.read_bytes()
    except FileNotFoundError as exc:
        raise ValueError(f"{what} {path} does not exist (create the directory with `fedsv certs`)") from exc
    except PermissionError as exc:
        raise ValueError(f"{what} {path} is not readable") from exc


def server_credentials(tls_dir: str | Path, require_client_auth: bool = True) -> grpc.ServerCredentials:
    """The coordinator's TLS credentials: coordinator.pem/.key; with client auth, clients must present a
    certificate that ca.pem signed (mutual TLS)."""
    root = Path(tls_dir)
    key = _read(root, "coordinator.key", "coordinator key")
    cert = _read(root, "coordinator.pem", "coordinator certificate")
    ca = _read(root, "ca.pem", "CA certificate") if require_client_auth else None
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=require_client_auth
    )


def channel_credentials(tls_dir: str | Path, rank: int) -> tuple[grpc.ChannelCredentials, bool]:
    """A rank's channel credentials: trust ca.pem; present pNNN.pem/.key when the directory has them.

    Returns (credentials, mutual): mutual is True when the rank presents its own certificate.
    """
    root = Path(tls_dir)
    ca = _read(root, "ca.pem", "CA certificate")
    name = participant_id(rank)
    cert_path, key_path = root / f"{name}.pem", root / f"{name}.key"
    if cert_path.exists() != key_path.exists():
        raise ValueError(f"{root} must hold both {name}.pem and {name}.key, or neither")
    if not cert_path.exists():
        return grpc.ssl_channel_credentials(root_certificates=ca), False
    key = _read(root, f"{name}.key", f"key of {name}")
    cert = _read(root, f"{name}.pem", f"certificate of {name}")
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

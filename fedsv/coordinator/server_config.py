"""Where and how the coordinator serves (ServerConfig); these may change between restarts of a run."""

from __future__ import annotations

from pydantic import model_validator

from fedsv.settings.choices import Precision, ValuationSchedule
from fedsv.settings.model import ConfigModel
from fedsv.settings.schema import setting
from fedsv.wire.limits import MAX_CHUNK_BYTES, MIN_CHUNK_BYTES


class ServerConfig(ConfigModel):
    """Where and how the coordinator serves; may change between restarts of a run."""

    state_dir: str = setting("state_dir")
    host: str = setting("host")
    port: int = setting("port")
    metrics_port: int = setting("metrics_port")
    port_file: str = setting("port_file")
    round_timeout: float = setting("round_timeout")
    quorum: float = setting("quorum")
    quorum_wait: float = setting("quorum_wait")
    join_timeout: float = setting("join_timeout")
    max_chunk_bytes: int = setting("max_chunk_bytes")
    max_update_bytes: int = setting("max_update_bytes")
    credential: str = setting("credential")
    tls_dir: str = setting("tls_dir")
    tls_client_auth: bool = setting("tls_client_auth")
    insecure: bool = setting("insecure")
    tokens_file: str = setting("tokens_file")
    health_port: int = setting("health_port")
    max_tensors: int = setting("max_tensors")
    valuation_schedule: ValuationSchedule = setting("valuation_schedule")
    valuation_device: str = setting("valuation_device")
    valuation_precision: Precision = setting("valuation_precision")
    valuation_backlog_bytes: int = setting("valuation_backlog_bytes")
    valuation_threads: int = setting("valuation_threads")
    max_samples_per_participant: int = setting("max_samples_per_participant")
    max_streams_per_participant: int = setting("max_streams_per_participant")
    max_participants: int = setting("max_participants")
    header_timeout: float = setting("header_timeout")
    end_grace: float = setting("end_grace")
    linger: float = setting("linger")

    @model_validator(mode="after")
    def _check_server(self) -> ServerConfig:
        """A chunk size the wire allows; one transport: TLS (telling members apart) or plaintext."""
        if not MIN_CHUNK_BYTES <= self.max_chunk_bytes <= MAX_CHUNK_BYTES:
            raise ValueError(
                f"max_chunk_bytes must be between {MIN_CHUNK_BYTES} and {MAX_CHUNK_BYTES} "
                "(just under the 4 MiB gRPC message limit)"
            )
        if self.tls_dir and self.insecure:
            raise ValueError("choose one of --tls-dir and --insecure, not both")
        if not self.tls_dir and not self.insecure:
            raise ValueError(
                "the coordinator needs --tls-dir DIR (TLS; create DIR with `fedsv certs`) "
                "or, for plaintext on a trusted network, --insecure"
            )
        if self.tls_dir and not self.tls_client_auth and not self.tokens_file:
            raise ValueError(
                "--no-tls-client-auth needs --tokens-file: without client certificates, per-participant "
                "tokens prove who submits"
            )
        return self

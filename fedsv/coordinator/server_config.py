"""Where and how the coordinator serves (ServerConfig); these may change between restarts of a run."""

from __future__ import annotations

from pydantic import model_validator

from fedsv.settings import process_settings as ps  # the settings' declarations
from fedsv.settings.model import ConfigModel
from fedsv.settings.schema import DECLARED
from fedsv.wire.limits import MAX_CHUNK_BYTES, MIN_CHUNK_BYTES


class ServerConfig(ConfigModel):
    """Where and how the coordinator serves; may change between restarts of a run."""

    state_dir: ps.state_dir = DECLARED
    host: ps.host = DECLARED
    port: ps.port = DECLARED
    metrics_port: ps.metrics_port = DECLARED
    port_file: ps.port_file = DECLARED
    round_timeout: ps.round_timeout = DECLARED
    quorum: ps.quorum = DECLARED
    quorum_wait: ps.quorum_wait = DECLARED
    join_timeout: ps.join_timeout = DECLARED
    max_chunk_bytes: ps.max_chunk_bytes = DECLARED
    max_update_bytes: ps.max_update_bytes = DECLARED
    credential: ps.credential = DECLARED
    tls_dir: ps.tls_dir = DECLARED
    tls_client_auth: ps.tls_client_auth = DECLARED
    insecure: ps.insecure = DECLARED
    tokens_file: ps.tokens_file = DECLARED
    health_port: ps.health_port = DECLARED
    max_tensors: ps.max_tensors = DECLARED
    valuation_schedule: ps.valuation_schedule = DECLARED
    valuation_device: ps.valuation_device = DECLARED
    valuation_precision: ps.valuation_precision = DECLARED
    valuation_backlog_bytes: ps.valuation_backlog_bytes = DECLARED
    valuation_threads: ps.valuation_threads = DECLARED
    max_samples_per_participant: ps.max_samples_per_participant = DECLARED
    max_streams_per_participant: ps.max_streams_per_participant = DECLARED
    max_participants: ps.max_participants = DECLARED
    header_timeout: ps.header_timeout = DECLARED
    end_grace: ps.end_grace = DECLARED
    linger: ps.linger = DECLARED

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

"""What a participant process is told on its command line (ParticipantConfig), from the settings schema."""

from __future__ import annotations

from pydantic import model_validator

from fedsv.config.checks import check_address, require
from fedsv.fl.device import resolve_device
from fedsv.participant.local import LocalSettings
from fedsv.settings.model import ConfigModel
from fedsv.settings.schema import setting


class ParticipantConfig(ConfigModel):
    """A participant process's settings: where the coordinator is, which ranks, how to reach it, what
    data and device its ranks train with. Flags, files and FEDSV_* variables come from these fields."""

    coordinator: str = setting("coordinator")
    rank: int | None = setting("rank")
    world_size: int | None = setting("world_size")
    ranks: str | None = setting("ranks")
    ranks_per_process: int | None = setting("ranks_per_process")
    credential: str = setting("credential")
    tls_dir: str = setting("tls_dir")
    insecure: bool = setting("insecure")
    tokens_file: str = setting("tokens_file")
    tls_server_name: str = setting("tls_server_name")
    task: str = setting("task")
    data: str = setting("data")
    data_dir: str = setting("data_dir")
    device: str = setting("device", default="cpu", why="a participant trains on the CPU unless told")
    threads: int = setting("threads", default=1, why="one torch thread trains deterministically")
    training_threads: int = setting("training_threads")
    give_up_after: float = setting("give_up_after")

    @model_validator(mode="after")
    def _check_participant(self) -> ParticipantConfig:
        """An address to dial, one transport, a device that exists."""
        require(
            bool(self.coordinator.strip()), "coordinator", "given: --coordinator HOST:PORT", self.coordinator
        )
        check_address("coordinator", self.coordinator)
        if bool(self.tls_dir) == bool(self.insecure):
            raise ValueError(
                "choose --tls-dir DIR (TLS; the directory `fedsv certs` made) or --insecure (plaintext)"
                if not self.insecure
                else "choose one of --tls-dir and --insecure, not both"
            )
        resolve_device(self.device)  # an unknown or absent device: a one-line error now
        return self

    @staticmethod
    def default_local() -> LocalSettings:
        """What a rank trains with when nothing is said: the settings' defaults."""
        fields = ParticipantConfig.model_fields
        return LocalSettings(*(fields[name].default for name in ("task", "data", "data_dir", "device")))

    @property
    def local(self) -> LocalSettings:
        """What every rank of this process trains with."""
        return LocalSettings(task=self.task, data=self.data, data_dir=self.data_dir, device=self.device)

"""What a participant process is told on its command line (ParticipantConfig), from the settings schema."""

from __future__ import annotations

from pydantic import model_validator

from fedsv.config.checks import check_address, require
from fedsv.fl.device import resolve_device
from fedsv.participant.local import LocalSettings
from fedsv.settings import process_settings as ps  # the settings' declarations
from fedsv.settings import run_settings as rs  # the settings' declarations
from fedsv.settings.model import ConfigModel
from fedsv.settings.schema import DECLARED, changed


class ParticipantConfig(ConfigModel):
    """A participant process's settings: where the coordinator is, which ranks, how to reach it, what
    data and device its ranks train with. Flags, files and FEDSV_* variables come from these fields."""

    coordinator: ps.coordinator = DECLARED
    rank: ps.rank = DECLARED
    world_size: ps.world_size = DECLARED
    ranks: ps.ranks = DECLARED
    ranks_per_process: ps.ranks_per_process = DECLARED
    credential: ps.credential = DECLARED
    tls_dir: ps.tls_dir = DECLARED
    insecure: ps.insecure = DECLARED
    tokens_file: ps.tokens_file = DECLARED
    tls_server_name: ps.tls_server_name = DECLARED
    task: rs.task = DECLARED
    data: ps.data = DECLARED
    data_dir: rs.data_dir = DECLARED
    device: ps.device = changed(ps.device, "cpu", why="a participant trains on the CPU unless told")
    threads: ps.threads = changed(ps.threads, 1, why="one torch thread trains deterministically")
    training_threads: ps.training_threads = DECLARED
    give_up_after: ps.give_up_after = DECLARED

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

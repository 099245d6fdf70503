from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TensorSpec(_message.Message):
    __slots__ = ("name", "dtype", "shape")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...

class TensorSetHeader(_message.Message):
    __slots__ = ("tensors", "total_bytes", "num_chunks", "sha256")
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    NUM_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    tensors: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    total_bytes: int
    num_chunks: int
    sha256: bytes
    def __init__(self, tensors: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., total_bytes: _Optional[int] = ..., num_chunks: _Optional[int] = ..., sha256: _Optional[bytes] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ("index", "data")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    index: int
    data: bytes
    def __init__(self, index: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ("rank", "world_size", "num_samples", "credential", "host", "participant_token")
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    rank: int
    world_size: int
    num_samples: int
    credential: str
    host: str
    participant_token: str
    def __init__(self, rank: _Optional[int] = ..., world_size: _Optional[int] = ..., num_samples: _Optional[int] = ..., credential: _Optional[str] = ..., host: _Optional[str] = ..., participant_token: _Optional[str] = ...) -> None: ...

class TrainSettings(_message.Message):
    __slots__ = ("epochs", "batch_size", "lr", "momentum", "weight_decay")
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    LR_FIELD_NUMBER: _ClassVar[int]
    MOMENTUM_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_DECAY_FIELD_NUMBER: _ClassVar[int]
    epochs: int
    batch_size: int
    lr: float
    momentum: float
    weight_decay: float
    def __init__(self, epochs: _Optional[int] = ..., batch_size: _Optional[int] = ..., lr: _Optional[float] = ..., momentum: _Optional[float] = ..., weight_decay: _Optional[float] = ...) -> None: ...

class RunSpec(_message.Message):
    __slots__ = ("run_id", "world_size", "seed", "dataset", "partition", "model", "train", "rounds", "corruption", "max_chunk_bytes", "validation_size", "task", "validation_from", "test_size")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    DATASET_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TRAIN_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    CORRUPTION_FIELD_NUMBER: _ClassVar[int]
    MAX_CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    VALIDATION_SIZE_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    VALIDATION_FROM_FIELD_NUMBER: _ClassVar[int]
    TEST_SIZE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    world_size: int
    seed: int
    dataset: str
    partition: str
    model: str
    train: TrainSettings
    rounds: int
    corruption: str
    max_chunk_bytes: int
    validation_size: int
    task: str
    validation_from: str
    test_size: int
    def __init__(self, run_id: _Optional[str] = ..., world_size: _Optional[int] = ..., seed: _Optional[int] = ..., dataset: _Optional[str] = ..., partition: _Optional[str] = ..., model: _Optional[str] = ..., train: _Optional[_Union[TrainSettings, _Mapping]] = ..., rounds: _Optional[int] = ..., corruption: _Optional[str] = ..., max_chunk_bytes: _Optional[int] = ..., validation_size: _Optional[int] = ..., task: _Optional[str] = ..., validation_from: _Optional[str] = ..., test_size: _Optional[int] = ...) -> None: ...

class JoinReply(_message.Message):
    __slots__ = ("participant_id", "session_token", "run")
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    participant_id: str
    session_token: str
    run: RunSpec
    def __init__(self, participant_id: _Optional[str] = ..., session_token: _Optional[str] = ..., run: _Optional[_Union[RunSpec, _Mapping]] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("participant_id", "session_token")
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    participant_id: str
    session_token: str
    def __init__(self, participant_id: _Optional[str] = ..., session_token: _Optional[str] = ...) -> None: ...

class RoundTask(_message.Message):
    __slots__ = ("round", "deadline_unix_ms", "model", "train_seed")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TRAIN_SEED_FIELD_NUMBER: _ClassVar[int]
    round: int
    deadline_unix_ms: int
    model: TensorSetHeader
    train_seed: int
    def __init__(self, round: _Optional[int] = ..., deadline_unix_ms: _Optional[int] = ..., model: _Optional[_Union[TensorSetHeader, _Mapping]] = ..., train_seed: _Optional[int] = ...) -> None: ...

class RunEnd(_message.Message):
    __slots__ = ("reason", "rounds_completed")
    REASON_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    reason: str
    rounds_completed: int
    def __init__(self, reason: _Optional[str] = ..., rounds_completed: _Optional[int] = ...) -> None: ...

class ServerEvent(_message.Message):
    __slots__ = ("task", "chunk", "end")
    TASK_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    task: RoundTask
    chunk: Chunk
    end: RunEnd
    def __init__(self, task: _Optional[_Union[RoundTask, _Mapping]] = ..., chunk: _Optional[_Union[Chunk, _Mapping]] = ..., end: _Optional[_Union[RunEnd, _Mapping]] = ...) -> None: ...

class UpdateHeader(_message.Message):
    __slots__ = ("participant_id", "session_token", "round", "num_samples", "delta", "train_seconds")
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    TRAIN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    participant_id: str
    session_token: str
    round: int
    num_samples: int
    delta: TensorSetHeader
    train_seconds: float
    def __init__(self, participant_id: _Optional[str] = ..., session_token: _Optional[str] = ..., round: _Optional[int] = ..., num_samples: _Optional[int] = ..., delta: _Optional[_Union[TensorSetHeader, _Mapping]] = ..., train_seconds: _Optional[float] = ...) -> None: ...

class UpdateMessage(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: UpdateHeader
    chunk: Chunk
    def __init__(self, header: _Optional[_Union[UpdateHeader, _Mapping]] = ..., chunk: _Optional[_Union[Chunk, _Mapping]] = ...) -> None: ...

class SubmitReply(_message.Message):
    __slots__ = ("accepted", "round", "bytes_received")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    round: int
    bytes_received: int
    def __init__(self, accepted: _Optional[bool] = ..., round: _Optional[int] = ..., bytes_received: _Optional[int] = ...) -> None: ...

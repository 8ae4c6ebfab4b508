# Post-processed by scripts/gen_protos.py (relative imports, private descriptor pool).
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DataType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DT_INVALID: _ClassVar[DataType]
    DT_UINT8: _ClassVar[DataType]
    DT_INT8: _ClassVar[DataType]
    DT_INT16: _ClassVar[DataType]
    DT_INT32: _ClassVar[DataType]
    DT_INT64: _ClassVar[DataType]
    DT_FLOAT16: _ClassVar[DataType]
    DT_FLOAT32: _ClassVar[DataType]
    DT_FLOAT64: _ClassVar[DataType]
    DT_STRING: _ClassVar[DataType]
DT_INVALID: DataType
DT_UINT8: DataType
DT_INT8: DataType
DT_INT16: DataType
DT_INT32: DataType
DT_INT64: DataType
DT_FLOAT16: DataType
DT_FLOAT32: DataType
DT_FLOAT64: DataType
DT_STRING: DataType

class GenericTensor(_message.Message):
    __slots__ = ("name", "dtype", "shape", "flat_uint8", "flat_int8", "flat_int16", "flat_int32", "flat_int64", "flat_float16", "flat_float32", "flat_float64", "flat_string")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    FLAT_UINT8_FIELD_NUMBER: _ClassVar[int]
    FLAT_INT8_FIELD_NUMBER: _ClassVar[int]
    FLAT_INT16_FIELD_NUMBER: _ClassVar[int]
    FLAT_INT32_FIELD_NUMBER: _ClassVar[int]
    FLAT_INT64_FIELD_NUMBER: _ClassVar[int]
    FLAT_FLOAT16_FIELD_NUMBER: _ClassVar[int]
    FLAT_FLOAT32_FIELD_NUMBER: _ClassVar[int]
    FLAT_FLOAT64_FIELD_NUMBER: _ClassVar[int]
    FLAT_STRING_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: DataType
    shape: _containers.RepeatedScalarFieldContainer[int]
    flat_uint8: _containers.RepeatedScalarFieldContainer[int]
    flat_int8: _containers.RepeatedScalarFieldContainer[int]
    flat_int16: _containers.RepeatedScalarFieldContainer[int]
    flat_int32: _containers.RepeatedScalarFieldContainer[int]
    flat_int64: _containers.RepeatedScalarFieldContainer[int]
    flat_float16: _containers.RepeatedScalarFieldContainer[float]
    flat_float32: _containers.RepeatedScalarFieldContainer[float]
    flat_float64: _containers.RepeatedScalarFieldContainer[float]
    flat_string: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[_Union[DataType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., flat_uint8: _Optional[_Iterable[int]] = ..., flat_int8: _Optional[_Iterable[int]] = ..., flat_int16: _Optional[_Iterable[int]] = ..., flat_int32: _Optional[_Iterable[int]] = ..., flat_int64: _Optional[_Iterable[int]] = ..., flat_float16: _Optional[_Iterable[float]] = ..., flat_float32: _Optional[_Iterable[float]] = ..., flat_float64: _Optional[_Iterable[float]] = ..., flat_string: _Optional[_Iterable[str]] = ...) -> None: ...

class GenericTensorData(_message.Message):
    __slots__ = ("tensors",)
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    tensors: _containers.RepeatedCompositeFieldContainer[GenericTensor]
    def __init__(self, tensors: _Optional[_Iterable[_Union[GenericTensor, _Mapping]]] = ...) -> None: ...

class NDArrayData(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GenericMapData(_message.Message):
    __slots__ = ("s_s", "s_b", "s_i32", "s_i64", "s_f", "s_d")
    class SSEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class SBEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    class SI32Entry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class SI64Entry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class SFEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class SDEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    S_S_FIELD_NUMBER: _ClassVar[int]
    S_B_FIELD_NUMBER: _ClassVar[int]
    S_I32_FIELD_NUMBER: _ClassVar[int]
    S_I64_FIELD_NUMBER: _ClassVar[int]
    S_F_FIELD_NUMBER: _ClassVar[int]
    S_D_FIELD_NUMBER: _ClassVar[int]
    s_s: _containers.ScalarMap[str, str]
    s_b: _containers.ScalarMap[str, bytes]
    s_i32: _containers.ScalarMap[str, int]
    s_i64: _containers.ScalarMap[str, int]
    s_f: _containers.ScalarMap[str, float]
    s_d: _containers.ScalarMap[str, float]
    def __init__(self, s_s: _Optional[_Mapping[str, str]] = ..., s_b: _Optional[_Mapping[str, bytes]] = ..., s_i32: _Optional[_Mapping[str, int]] = ..., s_i64: _Optional[_Mapping[str, int]] = ..., s_f: _Optional[_Mapping[str, float]] = ..., s_d: _Optional[_Mapping[str, float]] = ...) -> None: ...

class GrpsMessage(_message.Message):
    __slots__ = ("status", "model", "bin_data", "str_data", "gtensors", "ndarray", "gmap")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    BIN_DATA_FIELD_NUMBER: _ClassVar[int]
    STR_DATA_FIELD_NUMBER: _ClassVar[int]
    GTENSORS_FIELD_NUMBER: _ClassVar[int]
    NDARRAY_FIELD_NUMBER: _ClassVar[int]
    GMAP_FIELD_NUMBER: _ClassVar[int]
    status: Status
    model: str
    bin_data: bytes
    str_data: str
    gtensors: GenericTensorData
    ndarray: NDArrayData
    gmap: GenericMapData
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ..., model: _Optional[str] = ..., bin_data: _Optional[bytes] = ..., str_data: _Optional[str] = ..., gtensors: _Optional[_Union[GenericTensorData, _Mapping]] = ..., ndarray: _Optional[_Union[NDArrayData, _Mapping]] = ..., gmap: _Optional[_Union[GenericMapData, _Mapping]] = ...) -> None: ...

class Status(_message.Message):
    __slots__ = ("code", "msg", "status")
    class StatusFlag(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        UNKNOWN: _ClassVar[Status.StatusFlag]
        SUCCESS: _ClassVar[Status.StatusFlag]
        FAILURE: _ClassVar[Status.StatusFlag]
    UNKNOWN: Status.StatusFlag
    SUCCESS: Status.StatusFlag
    FAILURE: Status.StatusFlag
    CODE_FIELD_NUMBER: _ClassVar[int]
    MSG_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    code: int
    msg: str
    status: Status.StatusFlag
    def __init__(self, code: _Optional[int] = ..., msg: _Optional[str] = ..., status: _Optional[_Union[Status.StatusFlag, str]] = ...) -> None: ...

class EmptyGrpsMessage(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

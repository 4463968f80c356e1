"""ctypes binding of libgdn's C API (include/gdn.h): the library loader, the structs mirrored field
for field, torch tensor -> gdn_tensor descriptors, and status -> Python exception mapping.

The shared library is found, in order, at
  1. $GDN_LIBRARY (a path to libgdn.so),
  2. libgdn/_lib/libgdn.so next to this file (put there by `pip install ./python`),
  3. build/libgdn.so under the repository root (a CMake build of the checkout).
It is loaded on first use, so `import libgdn` works without it.
"""

import ctypes
import os
import threading

import torch

# ------------------------------------------------------------------------------------------------
# Enums (gdn.h)

GDN_OK = 0
GDN_ERR_INVALID_ARGUMENT = 1
GDN_ERR_UNSUPPORTED = 2
GDN_ERR_NOT_IMPLEMENTED = 3
GDN_ERR_NO_BACKEND = 4
GDN_ERR_WORKSPACE = 5
GDN_ERR_CUDA = 6
GDN_ERR_OUT_OF_MEMORY = 7
GDN_ERR_INTERNAL = 8

GDN_DTYPE_F32 = 0
GDN_DTYPE_BF16 = 1
GDN_DTYPE_F16 = 2
GDN_DTYPE_I32 = 3
GDN_DTYPE_F64 = 4

GDN_DEVICE_CPU = 0
GDN_DEVICE_CUDA = 1

GDN_STATE_KV = 0
GDN_STATE_VK = 1

GDN_GATE_GDN = 0
GDN_GATE_KDA = 1

GDN_MAX_RANK = 4

_DTYPES = {
    torch.float32: GDN_DTYPE_F32,
    torch.bfloat16: GDN_DTYPE_BF16,
    torch.float16: GDN_DTYPE_F16,
    torch.int32: GDN_DTYPE_I32,
    torch.float64: GDN_DTYPE_F64,
}

# ------------------------------------------------------------------------------------------------
# Structs: same field order and C types as gdn.h (enums are int, float is c_float).

_I64x4 = ctypes.c_int64 * GDN_MAX_RANK


class Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int),
        ("device", ctypes.c_int),
        ("device_ordinal", ctypes.c_int),
        ("rank", ctypes.c_int),
        ("shape", _I64x4),
        ("stride", _I64x4),
    ]


# The raw-gate inputs, alike in gdn_gate_params and gdn_gating_args.
_RAW_GATE_FIELDS = [
    ("a", Tensor),
    ("A_log", Tensor),
    ("dt_bias", Tensor),
    ("lower_bound", ctypes.c_float),
    ("softplus_beta", ctypes.c_float),
    ("softplus_threshold", ctypes.c_float),
]


class GateParams(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int), ("g", Tensor)] + _RAW_GATE_FIELDS + [
        ("beta", Tensor),
        ("beta_from_logits", ctypes.c_int),
        ("allow_neg_eigval", ctypes.c_int),
    ]


class GatingArgs(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int)] + _RAW_GATE_FIELDS + [
        ("g_out", Tensor),
        ("b", Tensor),
        ("allow_neg_eigval", ctypes.c_int),
        ("beta_out", Tensor),
        ("stream", ctypes.c_void_p),
    ]


# gdn_chunk_fwd_args and gdn_recurrent_fwd_args open with the same inputs and options and close with
# the same output and workspace; only their state fields in between differ.
FWD_INPUT_FIELDS = [
    ("q", Tensor),
    ("k", Tensor),
    ("v", Tensor),
    ("gate", GateParams),
    ("scale", ctypes.c_float),
    ("use_qk_l2norm", ctypes.c_int),
    ("cu_seqlens", Tensor),
    ("state_layout", ctypes.c_int),
]
FWD_OUTPUT_FIELDS = [
    ("o", Tensor),
    ("workspace", ctypes.c_void_p),
    ("workspace_bytes", ctypes.c_size_t),
    ("stream", ctypes.c_void_p),
]


class ChunkFwdArgs(ctypes.Structure):
    _fields_ = FWD_INPUT_FIELDS + [
        ("initial_state", Tensor),
        ("final_state", Tensor),
        ("state_indices", Tensor),
        ("has_initial_state", Tensor),
        ("null_slot_zero", ctypes.c_int),
        ("checkpoint_interval", ctypes.c_int64),
        ("checkpoint_indices", Tensor),
    ] + FWD_OUTPUT_FIELDS + [
        ("saved_states", ctypes.c_void_p),
        ("saved_states_bytes", ctypes.c_size_t),
    ]


class RecurrentFwdArgs(ctypes.Structure):
    _fields_ = FWD_INPUT_FIELDS + [
        ("state", Tensor),
        ("state_indices", Tensor),
        ("num_accepted_tokens", Tensor),
        ("inplace_state", ctypes.c_int),
        ("null_slot_zero", ctypes.c_int),
        ("final_state", Tensor),
        ("step_states", Tensor),
    ] + FWD_OUTPUT_FIELDS


class ChunkBwdArgs(ctypes.Structure):
    _fields_ = FWD_INPUT_FIELDS + [
        ("initial_state", Tensor),
        ("d_o", Tensor),
        ("dht", Tensor),
        ("dq", Tensor),
        ("dk", Tensor),
        ("dv", Tensor),
        ("dg", Tensor),
        ("da", Tensor),
        ("dA_log", Tensor),
        ("ddt_bias", Tensor),
        ("dbeta", Tensor),
        ("dh0", Tensor),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_size_t),
        ("stream", ctypes.c_void_p),
        ("saved_states", ctypes.c_void_p),
        ("saved_states_bytes", ctypes.c_size_t),
    ]


# ------------------------------------------------------------------------------------------------
# Errors


class GDNError(RuntimeError):
    """A libgdn call failed. `status` is the gdn_status code; the message carries gdn_last_error()."""

    def __init__(self, message, status=GDN_ERR_INTERNAL):
        super().__init__(message)
        self.status = status


class GDNInvalidArgumentError(GDNError, ValueError):
    """GDN_ERR_INVALID_ARGUMENT: a bad dtype, shape, stride, index or option."""


class GDNUnsupportedError(GDNError, NotImplementedError):
    """GDN_ERR_UNSUPPORTED, GDN_ERR_NOT_IMPLEMENTED or GDN_ERR_NO_BACKEND: valid arguments that this
    build or backend cannot run (head dim, strides, an op not yet on CUDA, a CPU-only build)."""


class GDNLibraryNotFoundError(GDNError, OSError):
    """libgdn.so could not be located or loaded."""


_STATUS_EXCEPTIONS = {
    GDN_ERR_INVALID_ARGUMENT: GDNInvalidArgumentError,
    GDN_ERR_UNSUPPORTED: GDNUnsupportedError,
    GDN_ERR_NOT_IMPLEMENTED: GDNUnsupportedError,
    GDN_ERR_NO_BACKEND: GDNUnsupportedError,
    GDN_ERR_WORKSPACE: GDNInvalidArgumentError,
}

# ------------------------------------------------------------------------------------------------
# Loading

_lib = None
_lib_lock = threading.Lock()


def library_candidates():
    """Paths tried, in order, for libgdn.so."""
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    paths = []
    if os.environ.get("GDN_LIBRARY"):
        paths.append(os.environ["GDN_LIBRARY"])
    paths.append(os.path.join(here, "_lib", "libgdn.so"))
    paths.append(os.path.join(repo, "build", "libgdn.so"))
    return paths


def _declare(lib):
    P = ctypes.POINTER
    lib.gdn_version_number.restype = ctypes.c_int
    lib.gdn_version_number.argtypes = []
    lib.gdn_version_string.restype = ctypes.c_char_p
    lib.gdn_version_string.argtypes = []
    lib.gdn_status_string.restype = ctypes.c_char_p
    lib.gdn_status_string.argtypes = [ctypes.c_int]
    lib.gdn_last_error.restype = ctypes.c_char_p
    lib.gdn_last_error.argtypes = []
    lib.gdn_has_cuda.restype = ctypes.c_int
    lib.gdn_has_cuda.argtypes = []
    lib.gdn_set_num_threads.restype = None
    lib.gdn_set_num_threads.argtypes = [ctypes.c_int]
    lib.gdn_get_num_threads.restype = ctypes.c_int
    lib.gdn_get_num_threads.argtypes = []
    lib.gdn_gating.restype = ctypes.c_int
    lib.gdn_gating.argtypes = [P(GatingArgs)]
    lib.gdn_chunk_fwd_workspace_size.restype = ctypes.c_int
    lib.gdn_chunk_fwd_workspace_size.argtypes = [P(ChunkFwdArgs), P(ctypes.c_size_t)]
    lib.gdn_chunk_fwd.restype = ctypes.c_int
    lib.gdn_chunk_fwd.argtypes = [P(ChunkFwdArgs)]
    lib.gdn_recurrent_fwd_workspace_size.restype = ctypes.c_int
    lib.gdn_recurrent_fwd_workspace_size.argtypes = [P(RecurrentFwdArgs), P(ctypes.c_size_t)]
    lib.gdn_recurrent_fwd.restype = ctypes.c_int
    lib.gdn_recurrent_fwd.argtypes = [P(RecurrentFwdArgs)]
    lib.gdn_chunk_saved_states_size.restype = ctypes.c_int
    lib.gdn_chunk_saved_states_size.argtypes = [P(ChunkFwdArgs), P(ctypes.c_size_t)]
    lib.gdn_chunk_bwd_workspace_size.restype = ctypes.c_int
    lib.gdn_chunk_bwd_workspace_size.argtypes = [P(ChunkBwdArgs), P(ctypes.c_size_t)]
    lib.gdn_chunk_bwd.restype = ctypes.c_int
    lib.gdn_chunk_bwd.argtypes = [P(ChunkBwdArgs)]


def lib():
    """The loaded libgdn (ctypes.CDLL), loading it on first use."""
    global _lib
    if _lib is not None:
        return _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        tried = []
        for path in library_candidates():
            if not os.path.exists(path):
                tried.append(f"{path} (missing)")
                continue
            try:
                handle = ctypes.CDLL(path)
            except OSError as e:
                tried.append(f"{path} ({e})")
                continue
            _declare(handle)
            _lib = handle
            return _lib
        raise GDNLibraryNotFoundError(
            "libgdn.so not found; build it (cmake -S . -B build && cmake --build build) or set "
            "GDN_LIBRARY=/path/to/libgdn.so. Tried: " + "; ".join(tried))


def library_path():
    """Path of the loaded library."""
    return lib()._name


def check(status, where):
    """Raise the exception for a non-OK status, with the library's message."""
    if status == GDN_OK:
        return
    L = lib()
    message = L.gdn_last_error().decode("utf-8", "replace")
    name = L.gdn_status_string(status).decode("utf-8", "replace").split(":")[0]
    exc = _STATUS_EXCEPTIONS.get(status, GDNError)
    raise exc(f"{where}: {message or name} [{name}]", status)


# ------------------------------------------------------------------------------------------------
# Tensors


def describe(t, name):
    """gdn_tensor for a torch tensor (or an absent one for None): data pointer, dtype, device,
    shape and strides in elements, passed through as they are."""
    d = Tensor()
    if t is None:
        return d
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _DTYPES:
        raise ValueError(f"{name}: dtype {t.dtype} is not supported (float32, bfloat16, float16, int32, float64)")
    if t.dim() < 1 or t.dim() > GDN_MAX_RANK:
        raise ValueError(f"{name}: {t.dim()} dimensions, libgdn takes 1 to {GDN_MAX_RANK}")
    if t.device.type == "cpu":
        d.device, d.device_ordinal = GDN_DEVICE_CPU, 0
    elif t.device.type == "cuda":
        d.device = GDN_DEVICE_CUDA
        d.device_ordinal = t.device.index if t.device.index is not None else torch.cuda.current_device()
    else:
        raise ValueError(f"{name}: device {t.device} is not supported (cpu or cuda)")
    if t.numel() == 0:
        # An empty tensor may have no storage (data_ptr() == 0); the library still needs a
        # non-NULL pointer to tell it from an absent tensor. No element is ever dereferenced.
        d.data = t.data_ptr() or _EMPTY_SENTINEL
    else:
        d.data = t.data_ptr()
    d.dtype = _DTYPES[t.dtype]
    rank = t.dim()
    d.rank = rank
    d.shape[:rank] = t.shape
    d.stride[:rank] = t.stride()
    return d


# 256-byte aligned, never read or written: stands in for the storage of zero-element tensors.
_EMPTY_SENTINEL = 256


def stream_of(t):
    """cudaStream_t (as an int) of torch's current stream on t's device; None for CPU tensors."""
    if t.device.type != "cuda":
        return None
    return torch.cuda.current_stream(t.device).cuda_stream


def workspace(nbytes, device):
    """(tensor, pointer) for a 256-byte aligned scratch area of nbytes from torch's allocator;
    (None, None) when nothing is needed. The tensor must stay alive until the call returns
    (on CUDA, torch's caching allocator keeps it valid for work queued on the current stream)."""
    if nbytes == 0:
        return None, None
    buf = torch.empty(nbytes + 256, dtype=torch.uint8, device=device)
    ptr = buf.data_ptr()
    return buf, (ptr + 255) // 256 * 256

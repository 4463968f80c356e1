"""libgdn: Gated DeltaNet kernels (CPU and CUDA) for PyTorch, with FLA's and vLLM's signatures.

    import libgdn
    o, ht = libgdn.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True)   # prefill
    o, _ = libgdn.fused_recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=pool,
                                                   ssm_state_indices=slots)             # decode

The shared library is found through $GDN_LIBRARY, libgdn/_lib/libgdn.so, or build/libgdn.so of the
checkout (see libgdn._capi).
"""

from ._capi import (
    GDNError,
    GDNInvalidArgumentError,
    GDNLibraryNotFoundError,
    GDNUnsupportedError,
    library_path,
)
from .kda import chunk_kda, fused_recurrent_kda
from .layer import GatedDeltaNet
from .ops import (
    chunk_gated_delta_rule,
    chunk_gdn,
    fused_gdn_gate,
    fused_gdn_gating,
    fused_recurrent_gated_delta_rule,
    fused_recurrent_gdn,
)
from .serving import fused_sigmoid_gating_delta_rule_update

__version__ = "0.1.0"

__all__ = [
    "GDNError",
    "GDNInvalidArgumentError",
    "GDNLibraryNotFoundError",
    "GDNUnsupportedError",
    "GatedDeltaNet",
    "chunk_gated_delta_rule",
    "chunk_gdn",
    "chunk_kda",
    "fused_gdn_gate",
    "fused_gdn_gating",
    "fused_recurrent_gated_delta_rule",
    "fused_recurrent_gdn",
    "fused_recurrent_kda",
    "fused_sigmoid_gating_delta_rule_update",
    "has_cuda",
    "library_path",
    "version",
]


def version():
    """Version string of the loaded C library ("MAJOR.MINOR.PATCH")."""
    from ._capi import lib
    return lib().gdn_version_string().decode()


def has_cuda():
    """True if the loaded library was built with the CUDA backend."""
    from ._capi import lib
    return bool(lib().gdn_has_cuda())

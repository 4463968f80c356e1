"""pytest setup: the package from this checkout, the `device` parameter (cpu, and cuda when torch
sees a GPU and the library has the CUDA backend; GDN_TEST_DEVICES=cpu,cuda overrides), poisoned
output buffers, and CUDA calls that the library reports as unsupported there turned into skips."""

import math
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import libgdn  # noqa: E402
from libgdn import _capi, _kernels  # noqa: E402


def _devices():
    if os.environ.get("GDN_TEST_DEVICES"):
        return [d.strip() for d in os.environ["GDN_TEST_DEVICES"].split(",") if d.strip()]
    devs = ["cpu"]
    if torch.cuda.is_available() and libgdn.has_cuda():
        devs.append("cuda")
    return devs


DEVICES = _devices()


def pytest_report_header(config):
    return [f"libgdn: {libgdn.library_path()} (version {libgdn.version()}, cuda backend {libgdn.has_cuda()}); "
            f"torch {torch.__version__}; devices {DEVICES}"]


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Outputs and states the package allocates start as NaN (ints as a sentinel), so that an
    element the library fails to write shows up in the error measure."""
    real = _kernels._empty

    def poisoned(shape, dtype, device):
        t = real(shape, dtype, device)
        if t.is_floating_point():
            t.fill_(math.nan)
        else:
            t.fill_(-7)
        return t

    monkeypatch.setattr(_kernels, "_empty", poisoned)
    yield


@pytest.fixture
def gen():
    """A fresh generator per test: new random inputs every run unless GDN_TEST_SEED is set."""
    g = torch.Generator()
    seed = int(os.environ["GDN_TEST_SEED"]) if os.environ.get("GDN_TEST_SEED") else torch.seed() % (2 ** 31)
    g.manual_seed(seed)
    return g


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """Run the test; on CUDA, what the library reports as not implemented or unsupported there
    (valid arguments the CUDA backend does not take, such as some dtypes and head dims) is a skip whose
    reason carries the library's message (pytest -rs lists them)."""
    args = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    try:
        pyfuncitem.obj(**args)
    except _capi.GDNUnsupportedError as e:
        if pyfuncitem.funcargs.get("device") == "cuda" and e.status in (_capi.GDN_ERR_NOT_IMPLEMENTED,
                                                                         _capi.GDN_ERR_UNSUPPORTED):
            pytest.skip(f"CUDA backend: {e}")
        raise
    return True


def import_fla_gdn():
    """FLA's fla.ops.gated_delta_rule, or None where FLA does not import. With
    GDN_FLA_FIRST_CONFIG=1 (short device leases) FLA's Triton autotuners keep only their first
    config, so that no tuning compile storm runs; FLA's timings are then not its best."""
    import importlib
    if os.environ.get("GDN_FLA_FIRST_CONFIG") == "1" and "fla" not in sys.modules:
        try:
            import triton
        except ImportError:
            return None
        if not getattr(triton.autotune, "gdn_first_config", False):
            autotune = triton.autotune

            def first_config(configs, *args, **kwargs):
                return autotune(list(configs)[:1], *args, **kwargs)

            first_config.gdn_first_config = True
            triton.autotune = first_config
    try:
        return importlib.import_module("fla.ops.gated_delta_rule")
    except Exception:  # noqa: BLE001 - any failure to import means: no FLA here
        return None


@pytest.fixture
def c_calls(monkeypatch):
    """A Counter of the calls into the C library's entry points (gdn_chunk_fwd, gdn_recurrent_fwd,
    gdn_gating, gdn_chunk_bwd) made during the test, by entry point name."""
    import collections
    counts = collections.Counter()
    lib = _capi.lib()
    for name in ("gdn_chunk_fwd", "gdn_recurrent_fwd", "gdn_gating", "gdn_chunk_bwd"):
        real = getattr(lib, name)

        def counted(*args, _real=real, _name=name):
            counts[_name] += 1
            return _real(*args)

        monkeypatch.setattr(lib, name, counted)
    return counts

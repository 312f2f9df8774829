"""The DLPack bridge (byteps.torch._C) and the package's import-time checks.

Fake DLPack capsules are built with ctypes where torch cannot produce the
case here (a CUDA tensor, an observable deleter).
"""

from __future__ import annotations

import gc
import glob
import os
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch

import byteps.torch
from byteps.testkit import dlpack
from byteps.torch import _C

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CODES = {torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3, torch.int32: 4, torch.int64: 5}


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    flat = tensor.contiguous().reshape(-1)
    if flat.dtype == torch.bfloat16:
        flat = flat.view(torch.int16)
    return flat.numpy().tobytes()


# --- real torch tensors ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", list(CODES))
@pytest.mark.parametrize("shape", [(), (0,), (5,), (2, 3), (2, 3, 4), (1, 4, 1)])
def test_dtypes_and_shapes(dtype, shape):
    tensor = (torch.arange(int(torch.Size(shape).numel())) - 3).reshape(shape).to(dtype)
    view, code, got_shape = _C.from_dlpack(tensor.__dlpack__())
    assert code == CODES[dtype] and got_shape == shape
    assert isinstance(view, memoryview) and not view.readonly and view.format == "B"
    assert view.nbytes == tensor.numel() * tensor.element_size()
    assert bytes(view) == tensor_bytes(tensor)


def test_writes_go_to_the_tensor_and_memory_outlives_it():
    tensor = torch.zeros(4, dtype=torch.float32)
    view, _, _ = _C.from_dlpack(tensor.__dlpack__())
    np.frombuffer(view, dtype=np.float32)[:] = [1, 2, 3, 4]
    assert tensor.tolist() == [1, 2, 3, 4]
    del tensor
    gc.collect()
    assert np.frombuffer(view, dtype=np.float32).tolist() == [1, 2, 3, 4]


def test_offset_view_and_size_one_dimensions():
    base = torch.arange(10.0)
    view, _, shape = _C.from_dlpack(base[3:7].__dlpack__())
    assert np.frombuffer(view, dtype=np.float32).tolist() == [3, 4, 5, 6] and shape == (4,)
    row = torch.arange(4.0).reshape(4, 1).t()  # shape (1, 4), strides (1, 1): contiguous
    view, _, shape = _C.from_dlpack(row.__dlpack__())
    assert shape == (1, 4) and np.frombuffer(view, dtype=np.float32).tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("make", [lambda: torch.arange(6.0).reshape(2, 3).t(),
                                  lambda: torch.arange(12.0).reshape(3, 4)[:, ::2],
                                  lambda: torch.arange(8.0)[::2]])
def test_non_contiguous_is_refused_and_the_capsule_left_alone(make):
    capsule = make().__dlpack__()
    with pytest.raises(ValueError, match=r"not contiguous \(shape .*strides .*tensor.contiguous\(\)"):
        _C.from_dlpack(capsule)
    assert '"dltensor"' in repr(capsule)


@pytest.mark.parametrize("dtype,name", [(torch.uint8, "uint8"), (torch.int8, "int8"), (torch.int16, "int16"),
                                        (torch.bool, "bool"), (torch.complex64, "complex64")])
def test_unsupported_dtypes_are_named(dtype, name):
    with pytest.raises(ValueError, match=f"unsupported dtype {name}: byteps reduces float32, float64, "
                                         "float16, bfloat16, int32, int64"):
        _C.from_dlpack(torch.zeros(3, dtype=dtype).__dlpack__())


def test_capsules_are_single_use_and_checked():
    capsule = torch.ones(2).__dlpack__()
    _C.from_dlpack(capsule)
    assert '"used_dltensor"' in repr(capsule)
    with pytest.raises(ValueError, match="already consumed"):
        _C.from_dlpack(capsule)
    with pytest.raises(TypeError, match="DLPack capsule"):
        _C.from_dlpack(torch.ones(2))


# --- fake capsules: devices, deleters, exotic dtypes -----------------------------------------


FakeTensor = dlpack.FakeTensor  # a DLPack producer made with ctypes: counts how often its deleter runs


def test_deleter_runs_once_when_the_last_view_goes():
    fake = FakeTensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    view, code, shape = _C.from_dlpack(fake.capsule)
    assert (code, shape, fake.deleted) == (0, (2, 3), 0)
    array = np.frombuffer(view, dtype=np.float32)  # holds the view
    del view
    gc.collect()
    assert fake.deleted == 0 and array.tolist() == [0, 1, 2, 3, 4, 5]
    del array
    gc.collect()
    assert fake.deleted == 1


@pytest.mark.parametrize("device_type,name", [(2, "cuda:0"), (10, "rocm:0"), (13, "cuda_managed:0")])
def test_device_memory_must_be_staged(device_type, name):
    fake = FakeTensor(np.zeros(3, dtype=np.float32), device_type=device_type)
    with pytest.raises(ValueError, match=f"lives on {name}; byteps reads CPU memory only: it must be staged"):
        _C.from_dlpack(fake.capsule)
    assert '"dltensor"' in repr(fake.capsule) and fake.deleted == 0  # still the producer's to free


@pytest.mark.parametrize("code,bits,lanes,name", [(1, 16, 1, "uint16"), (2, 8, 1, "float8"),
                                                  (2, 32, 4, "float32 x4 lanes"), (5, 128, 1, "complex128")])
def test_exotic_dtypes_are_named(code, bits, lanes, name):
    fake = FakeTensor(np.zeros(8, dtype=np.uint64), code=code, bits=bits, lanes=lanes)
    with pytest.raises(ValueError, match=f"unsupported dtype {name}:"):
        _C.from_dlpack(fake.capsule)


def test_versioned_capsules_are_refused_clearly():
    fake = FakeTensor(np.zeros(2, dtype=np.float32), name=b"dltensor_versioned")
    with pytest.raises(ValueError, match="not 'dltensor'"):
        _C.from_dlpack(fake.capsule)


# --- no libtorch inside ---------------------------------------------------------------------


def extension_path() -> str:
    found = glob.glob(os.path.join(os.path.dirname(_C.__file__), "_C*.so"))
    assert len(found) == 1, found
    return found[0]


def elf_needed_and_dynstr(path: str):
    """NEEDED entries and the dynamic string table of a 64-bit little-endian ELF file."""
    data = open(path, "rb").read()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, "not a 64-bit little-endian ELF file"
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    dynamic = next(s for s in sections if s[1] == 6)  # SHT_DYNAMIC
    strtab = sections[dynamic[6]]  # its sh_link: .dynstr
    dynstr = data[strtab[4]:strtab[4] + strtab[5]]
    needed = []
    for offset in range(dynamic[4], dynamic[4] + dynamic[5], 16):
        tag, value = struct.unpack_from("<qQ", data, offset)
        if tag == 0:
            break
        if tag == 1:  # DT_NEEDED
            needed.append(dynstr[value:dynstr.index(b"\0", value)].decode())
    return needed, dynstr


def test_extension_does_not_link_libtorch():
    needed, dynstr = elf_needed_and_dynstr(extension_path())
    assert needed, "no NEEDED entries found: the ELF reader is broken"
    assert not [lib for lib in needed if "torch" in lib or "c10" in lib], needed
    # nor does it import any torch / ATen / c10 symbol
    for marker in (b"_ZN3c10", b"_ZN2at", b"torch", b"_ZN5torch"):
        assert marker not in dynstr, marker
    if shutil.which("ldd"):
        resolved = subprocess.run(["ldd", extension_path()], capture_output=True, text=True).stdout
        assert "libtorch" not in resolved and "libc10" not in resolved, resolved


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_extension_loads_without_torch():
    code = ("import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('_C', {extension_path()!r})\n"
            "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
            "assert 'torch' not in sys.modules, 'torch got imported'\n"
            "print(module.SUPPORTED_DTYPES)\n")
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert "bfloat16" in result.stdout


# --- import-time checks ---------------------------------------------------------------------


def test_import_without_torch_says_what_to_install():
    result = run_python("import sys; sys.modules['torch'] = None\nimport byteps.torch")
    assert result.returncode != 0
    assert "ImportError: byteps.torch needs PyTorch: pip install torch" in result.stderr, result.stderr


def test_too_old_torch_is_an_import_error():
    result = run_python("import sys, types; fake = types.ModuleType('torch'); fake.__version__ = '1.13.1+cpu'\n"
                        "sys.modules['torch'] = fake\nimport byteps.torch")
    assert result.returncode != 0
    assert "byteps-torch needs torch >= 2.1, but torch 1.13.1+cpu is installed" in result.stderr, result.stderr


def test_byteps_common_interface_mismatch_is_an_import_error():
    result = run_python("import byteps.common; byteps.common.INTERFACE_VERSION = (4, 0)\nimport byteps.torch")
    assert result.returncode != 0
    assert "InterfaceVersionError" in result.stderr and "byteps-torch" in result.stderr
    assert "byteps-common" in result.stderr and "(>= 3.6)" in result.stderr, result.stderr


def test_interface_version_and_namespace():
    assert byteps.torch.INTERFACE_VERSION == (1, 0)
    assert not os.path.exists(os.path.join(PACKAGE_ROOT, "src", "byteps", "__init__.py"))

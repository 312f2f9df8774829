"""The DLPack bridge (byteps.tensorflow._C) and the package's import-time checks.

Fake DLPack capsules are built with ctypes where TensorFlow cannot produce
the case here (a GPU tensor, an observable deleter).
"""

from __future__ import annotations

import gc
import glob
import os
import shutil
import struct
import subprocess
import sys
import threading
from typing import Dict, Optional

import numpy as np
import pytest
import tensorflow as tf

import byteps.tensorflow
from byteps.tensorflow import _C
from byteps.testkit import dlpack

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CODES = {tf.float32: 0, tf.float64: 1, tf.float16: 2, tf.bfloat16: 3, tf.int32: 4, tf.int64: 5}


def capsule_of(tensor: tf.Tensor):
    return tf.experimental.dlpack.to_dlpack(tensor)


def tensor_bytes(tensor: tf.Tensor) -> bytes:
    if tensor.dtype == tf.bfloat16:
        tensor = tf.bitcast(tensor, tf.uint16)
    return tensor.numpy().tobytes()


# --- TensorFlow tensors in -------------------------------------------------------------------


@pytest.mark.parametrize("dtype", list(CODES))
@pytest.mark.parametrize("shape", [(), (0,), (5,), (2, 3), (1, 4, 1)])
def test_tensors_in_every_dtype_and_shape(dtype, shape):
    tensor = tf.cast(tf.reshape(tf.range(int(np.prod(shape))) - 3, shape), dtype)
    view, code, got_shape = _C.from_dlpack(capsule_of(tensor))
    assert code == CODES[dtype] and got_shape == shape
    assert isinstance(view, memoryview) and view.format == "B"
    assert view.nbytes == int(np.prod(shape)) * dtype.size
    assert bytes(view) == tensor_bytes(tensor)


def test_the_view_keeps_the_tensor_alive():
    view, _, _ = _C.from_dlpack(capsule_of(tf.constant([1.0, 2.0, 3.0])))
    gc.collect()
    assert np.frombuffer(view, dtype=np.float32).tolist() == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("dtype,name", [(tf.uint8, "uint8"), (tf.int8, "int8"), (tf.int16, "int16"),
                                        (tf.bool, "bool"), (tf.complex64, "complex64")])
def test_unsupported_dtypes_are_named(dtype, name):
    capsule = capsule_of(tf.zeros([3], dtype))
    with pytest.raises(ValueError, match=f"unsupported dtype {name}: byteps reduces float32, float64, "
                                         "float16, bfloat16, int32, int64"):
        _C.from_dlpack(capsule)
    assert '"dltensor"' in repr(capsule)  # refused capsules stay the producer's


def test_capsules_are_single_use_and_checked():
    capsule = capsule_of(tf.ones([2]))
    _C.from_dlpack(capsule)
    assert '"used_dltensor"' in repr(capsule)
    with pytest.raises(ValueError, match="already consumed"):
        _C.from_dlpack(capsule)
    with pytest.raises(TypeError, match="DLPack capsule"):
        _C.from_dlpack(tf.ones([2]))


# --- result buffers out ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", list(CODES))
def test_result_buffers_become_tensors_without_a_copy(dtype):
    source = tf.cast(tf.reshape(tf.range(6) - 2, [2, 3]), dtype)
    view, code, shape = _C.from_dlpack(capsule_of(source))
    buffer = _C.HostBuffer(view.nbytes)
    assert buffer.address % _C.ALIGNMENT == 0
    buffer.write_at(0, view)
    result = tf.experimental.dlpack.from_dlpack(buffer.to_dlpack(code, list(shape)))
    assert result.dtype == dtype and result.shape == (2, 3)
    assert tensor_bytes(result) == tensor_bytes(source)
    np.frombuffer(buffer, dtype=np.uint8)[:] = 0  # the tensor is the buffer's memory
    assert not np.any(tf.cast(result, tf.float64).numpy())


def test_memory_outlives_the_buffer_and_is_freed_from_any_thread():
    buffer = _C.HostBuffer(16, zero=True)
    result = tf.experimental.dlpack.from_dlpack(buffer.to_dlpack(0, [4]))
    np.frombuffer(buffer, dtype=np.float32)[:] = 5.0
    del buffer
    gc.collect()
    assert (result + 1).numpy().tolist() == [6.0] * 4
    holder = [result]
    thread = threading.Thread(target=holder.clear)  # TensorFlow may free it on any thread
    del result
    thread.start()
    thread.join()


def test_result_buffer_checks():
    buffer = _C.HostBuffer(8)
    with pytest.raises(ValueError, match="needs 12 bytes, the buffer has 8"):
        buffer.to_dlpack(0, [3])
    with pytest.raises(ValueError, match="unknown byteps dtype code 9"):
        buffer.to_dlpack(9, [1])
    with pytest.raises(ValueError, match="overflow a buffer of 8 bytes"):
        buffer.write_at(4, np.zeros(2, dtype=np.float32))
    capsule = buffer.to_dlpack(0, [2])
    del capsule  # never consumed: its destructor frees what it owns
    gc.collect()
    prefix = tf.experimental.dlpack.from_dlpack(_C.HostBuffer(64, zero=True).to_dlpack(1, [0, 4]))
    assert prefix.shape == (0, 4) and prefix.dtype == tf.float64


# --- fake capsules: devices and deleters -----------------------------------------------------


FakeTensor = dlpack.FakeTensor  # a DLPack producer made with ctypes: counts how often its deleter runs


def test_deleter_runs_once_when_the_last_view_goes():
    fake = FakeTensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    view, code, shape = _C.from_dlpack(fake.capsule)
    assert (code, shape, fake.deleted) == (0, (2, 3), 0)
    array = np.frombuffer(view, dtype=np.float32)
    del view
    gc.collect()
    assert fake.deleted == 0 and array.tolist() == [0, 1, 2, 3, 4, 5]
    del array
    gc.collect()
    assert fake.deleted == 1


@pytest.mark.parametrize("device_type,name", [(2, "cuda:0"), (10, "rocm:0")])
def test_device_memory_is_refused(device_type, name):
    fake = FakeTensor(np.zeros(3, dtype=np.float32), device_type=device_type)
    with pytest.raises(ValueError, match=f"lives on {name}; byteps reads CPU memory only"):
        _C.from_dlpack(fake.capsule)
    assert fake.deleted == 0


def test_non_contiguous_is_refused():
    fake = FakeTensor(np.zeros((2, 3), dtype=np.float32), strides=(1, 2))
    with pytest.raises(ValueError, match=r"not contiguous \(shape \[2, 3\], strides \[1, 2\]"):
        _C.from_dlpack(fake.capsule)


# --- no TensorFlow inside ---------------------------------------------------------------------


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


def test_extension_does_not_link_tensorflow():
    needed, dynstr = elf_needed_and_dynstr(extension_path())
    assert needed, "no NEEDED entries found: the ELF reader is broken"
    assert not [lib for lib in needed if "tensorflow" in lib], needed
    for marker in (b"tensorflow", b"_ZN10tensorflow", b"TF_", b"TFE_"):
        assert marker not in dynstr, marker
    if shutil.which("ldd"):
        resolved = subprocess.run(["ldd", extension_path()], capture_output=True, text=True).stdout
        assert "tensorflow" not in resolved, resolved


# --- the graph error op (byteps.tensorflow.graph_errors) -----------------------------------------


def test_graph_error_op_has_no_tensorflow_symbol():
    """It reaches TensorFlow's C API through dlsym, so no TF_ symbol is imported and no TF library needed."""
    from byteps.tensorflow import graph_errors
    needed, dynstr = elf_needed_and_dynstr(str(graph_errors._LIBRARY))
    assert needed and not [lib for lib in needed if "tensorflow" in lib], needed
    # the names it looks up are in .rodata, not in the dynamic symbol table
    for marker in (b"_ZN10tensorflow", b"TF_NewKernelBuilder", b"TF_SetStatus"):
        assert marker not in dynstr, marker


def test_graph_error_op_fails_with_the_code_and_message_it_is_given():
    from byteps.tensorflow import graph_errors
    assert graph_errors.available()
    with tf.Graph().as_default():
        values = [tf.constant([1.0, 2.0]), tf.constant([[3]], dtype=tf.int64)]
        message = b"ranks disagree: rank 0 has (3,), rank 1 has (4,)"

        def outputs(code: int):
            return [*values, tf.constant(code), tf.constant(list(message), tf.uint8)]

        forwarded = graph_errors.forward_or_fail(outputs(0))
        failed = graph_errors.forward_or_fail(outputs(9))  # FAILED_PRECONDITION
        invalid = graph_errors.forward_or_fail(outputs(3))  # INVALID_ARGUMENT
        assert forwarded[0].shape == (2,) and forwarded[1].shape == (1, 1)
        with tf.compat.v1.Session() as session:
            first, second = session.run(forwarded)
            assert first.tolist() == [1.0, 2.0] and second.tolist() == [[3]]
            with pytest.raises(tf.errors.FailedPreconditionError, match="rank 1 has"):
                session.run(failed)
            with pytest.raises(tf.errors.InvalidArgumentError, match="ranks disagree"):
                session.run(invalid)


def test_guard_turns_op_errors_into_data_and_lets_others_through():
    from byteps.tensorflow import graph_errors
    from byteps.tensorflow.reduction import MismatchError

    def mismatch(x):
        raise MismatchError("shapes differ")

    *values, code, message = graph_errors.guard(mismatch, [tf.float32])(tf.ones(2))
    assert values[0].dtype == tf.float32 and int(code) == 9 and bytes(message.numpy()) == b"shapes differ"
    *values, code, message = graph_errors.guard(lambda x: [x * 2], [tf.float32])(tf.ones(2))
    assert values[0].numpy().tolist() == [2.0, 2.0] and int(code) == 0 and message.shape == (0,)
    with pytest.raises(KeyError):
        graph_errors.guard(lambda x: {}["missing"], [tf.float32])(tf.ones(2))


def run_python(code: str, env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_extension_loads_without_tensorflow():
    code = ("import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('_C', {extension_path()!r})\n"
            "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
            "assert 'tensorflow' not in sys.modules, 'tensorflow got imported'\n"
            "print(module.SUPPORTED_DTYPES)\n")
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert "bfloat16" in result.stdout


# --- import-time checks (fake modules, so no TensorFlow import is paid) -----------------------


def test_import_without_tensorflow_says_what_to_install():
    result = run_python("import sys; sys.modules['tensorflow'] = None\nimport byteps.tensorflow")
    assert result.returncode != 0
    assert "ImportError: byteps.tensorflow needs TensorFlow: pip install tensorflow" in result.stderr, result.stderr


def test_too_old_tensorflow_is_an_import_error():
    result = run_python("import sys, types; fake = types.ModuleType('tensorflow'); fake.__version__ = '2.15.1'\n"
                        "sys.modules['tensorflow'] = fake\nimport byteps.tensorflow")
    assert result.returncode != 0
    assert "byteps-tf needs tensorflow >= 2.16, but tensorflow 2.15.1 is installed" in result.stderr, result.stderr


def test_byteps_common_interface_mismatch_is_an_import_error():
    result = run_python("import sys, types; fake = types.ModuleType('tensorflow'); fake.__version__ = '2.21.0'\n"
                        "sys.modules['tensorflow'] = fake\n"
                        "import byteps.common; byteps.common.INTERFACE_VERSION = (4, 0)\nimport byteps.tensorflow")
    assert result.returncode != 0
    assert "InterfaceVersionError" in result.stderr and "byteps-tf" in result.stderr, result.stderr
    assert "byteps-common" in result.stderr and "(>= 3.6)" in result.stderr, result.stderr


def test_keras_2_as_keras_missing_tf_keras_and_other_backends_are_import_errors():
    result = run_python(
        "import sys, types\n"
        "fake = types.ModuleType('keras'); fake.__version__ = '2.15.0'; sys.modules['keras'] = fake\n"
        "for version, backend in (('2.15.0', 'tensorflow'), ('3.9.0', 'jax')):\n"
        "    fake.__version__ = version; fake.backend = types.SimpleNamespace(backend=lambda: backend)\n"
        "    try:\n"
        "        import byteps.tensorflow.keras\n"
        "    except ImportError as exc:\n"
        "        print('ImportError:', exc)\n")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "keras 2.15.0 is installed as 'keras': byteps takes Keras 3 from 'keras'" in result.stdout, result.stdout
    assert "or Keras 2 from tf-keras with TF_USE_LEGACY_KERAS=1" in result.stdout, result.stdout
    assert "needs Keras's TensorFlow backend, this process uses 'jax': set KERAS_BACKEND=tensorflow" \
        in result.stdout, result.stdout
    # Keras 2 asked for, tf_keras not installed (None in sys.modules: its import fails)
    result = run_python("import sys; sys.modules['tf_keras'] = None\n"
                        "import byteps.tensorflow.keras", env={"TF_USE_LEGACY_KERAS": "1"})
    assert result.returncode != 0
    assert "TF_USE_LEGACY_KERAS=1 asks for Keras 2, the tf_keras package, which is not installed: pip install " \
           "'tf-keras==<your TensorFlow's version>.*'" in result.stderr, result.stderr[-2000:]


def test_interface_version_and_namespace():
    assert byteps.tensorflow.INTERFACE_VERSION == (1, 0)
    assert not os.path.exists(os.path.join(PACKAGE_ROOT, "src", "byteps", "__init__.py"))

"""The committed type stubs (python/ariadne/_ariadne.pyi) match the built module, and the module
leaks nothing at interpreter exit.

Regenerate with scripts/py-stubs after changing a binding. Stub text depends on nanobind's
stubgen version, so the comparison runs only with the version that wrote the committed file.
"""

import ast
import pathlib
import re
import subprocess
import sys

import pytest

STUBGEN_VERSION = "3.1"  # nanobind major.minor that generated the committed stubs
STUB = pathlib.Path(__file__).resolve().parents[2] / "python" / "ariadne" / "_ariadne.pyi"


def test_committed_stubs_match_the_module(tmp_path):
    nanobind = pytest.importorskip("nanobind")
    if not nanobind.__version__.startswith(STUBGEN_VERSION + "."):
        pytest.skip(f"stubs were generated with nanobind {STUBGEN_VERSION}, this is {nanobind.__version__}")
    fresh = tmp_path / "_ariadne.pyi"
    subprocess.run([sys.executable, "-m", "nanobind.stubgen", "-q", "-m", "ariadne._ariadne", "-o", str(fresh)],
                   check=True)
    assert fresh.read_text() == STUB.read_text(), "stale stubs: run scripts/py-stubs and commit the result"


def test_stubs_are_valid_python():
    """The stubs parse (a signature with a required argument after a defaulted one would not)."""
    ast.parse(STUB.read_text())


def test_array_arguments_are_typed():
    """Every array argument of the stubs names its dtype (typed stubs): no bare NDArray."""
    text = STUB.read_text()
    assert "Annotated[NDArray, " not in text and not re.search(r": NDArray[,)]", text)
    assert "q: Annotated[NDArray[numpy.float32 | numpy.float16 | numpy.uint16], dict(shape=(None, None, None)" in text


LEAK_SCRIPT = """
import numpy as np, ariadne
KEEP = [ariadne.Pattern.causal(), ariadne.order((8, 8), "block_col"), ariadne.schedule("ariadne")]
q = np.ones((40, 2, 8), np.float32)
out, lse = ariadne.attention(q, q, q, pattern=ariadne.Pattern.window(3, 3), lse=True, backend="reference")
mask = ariadne.BlockMask.random(ariadne.Pattern.causal(), 8, 2, 40, 40, 0.5, 1)
KEEP += [mask, mask.row_ptr, KEEP[1].perm, ariadne.flops("ariadne", 448)]
try:
    ariadne.attention(q, q[:, :1], q, backend="reference")
except ariadne.Error as e:
    KEEP.append(e)
"""


def test_no_leaks_at_exit():
    """nanobind reports objects of the module still alive when the interpreter exits (a reference
    counting error in the bindings); objects kept in globals until exit must all be freed."""
    run = subprocess.run([sys.executable, "-c", LEAK_SCRIPT], capture_output=True, text=True, check=True)
    assert "leaked" not in run.stderr, run.stderr

"""The committed type stubs (python/ariadne/_ariadne.pyi) match the built module.

Regenerate with scripts/py-stubs after changing a binding. Stub text depends on nanobind's
stubgen version, so the comparison runs only with the version that wrote the committed file.
"""

import pathlib
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

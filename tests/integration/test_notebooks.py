"""The notebooks in notebooks/ run end to end, in their small mode, so that they never rot.

Each notebook reads ``OTB_NB_SMALL=1`` in its first code cell and shrinks itself (short completions, two training
steps, a handful of tokens for the fidelity check). The kernel is this interpreter (``sys.executable``, the venv's
python under ``make test``), named through a kernelspec written into a temporary directory: nothing has to be
installed by hand, and a ``python3`` kernelspec elsewhere on the machine cannot substitute another interpreter.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"
NOTEBOOKS = ("otb_walkthrough.ipynb", "lora_qlora_fidelity.ipynb")
KERNEL_NAME = "trl-otb-test-python"


def _kernel_manager(tmp_path: Path):
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    spec_dir = tmp_path / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "trl-otb tests",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    specs = KernelSpecManager(kernel_dirs=[str(spec_dir.parent)], ensure_native_kernel=False)
    return AsyncKernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=specs)


def _outputs(nb, output_type=None, mime=None):
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            if output_type and output["output_type"] != output_type:
                continue
            if mime and mime not in output.get("data", {}):
                continue
            yield output


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_committed_notebooks_have_no_outputs(name):
    import nbformat

    nb = nbformat.read(NOTEBOOK_DIR / name, as_version=4)
    nbformat.validate(nb)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert code, f"{name} has no code cell"
    assert "OTB_NB_SMALL" in code[0].source, f"{name}: the first code cell must read OTB_NB_SMALL"
    dirty = [i for i, cell in enumerate(code) if cell.outputs or cell.execution_count is not None]
    assert not dirty, f"{name}: clear the outputs and execution counts of code cells {dirty} before committing"


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_in_small_mode(name, tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("OTB_NB_SMALL", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # The kernel computes beside pytest: more torch threads than free cores makes a shared CPU runner ~10x slower.
    if "OMP_NUM_THREADS" not in os.environ:
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
    nb = nbformat.read(NOTEBOOK_DIR / name, as_version=4)
    client = NotebookClient(
        nb,
        km=_kernel_manager(tmp_path),
        timeout=900,
        resources={"metadata": {"path": str(tmp_path)}},  # the kernel's working directory: outputs/ lands there
    )
    client.execute()

    assert not list(_outputs(nb, output_type="error"))
    assert list(_outputs(nb, mime="image/png")), f"{name} drew no figure"
    text = "".join(o.get("text", "") for o in _outputs(nb, output_type="stream"))
    assert "small mode: True" in text
    if name == "otb_walkthrough.ipynb":
        assert list(_outputs(nb, mime="text/html")), "the token view is missing"

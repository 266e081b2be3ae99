"""The README's quick start runs exactly as written."""
from __future__ import annotations

import pathlib
import re

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def test_python_examples_run(capsys, tmp_path, monkeypatch):
    """Every python block, in order, in a scratch directory (the package example writes gru.so)."""
    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) >= 3, "README lost an example"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})
    errors = [float(e) for e in re.findall(r"max \|y - torch\|: (\S+)", capsys.readouterr().out)]
    assert len(errors) == 2 and max(errors) < 1e-4

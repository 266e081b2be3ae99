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


def test_the_front_door_stays_short_and_self_contained():
    """At most 15 KB, and every relative link points inside the repository, at a file that exists."""
    text = README.read_text()
    assert len(text.encode()) <= 15_000
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if not re.match(r"[a-z]+://", link)]
    assert local and all(not link.startswith("..") and (README.parent / link).exists() for link in local), local

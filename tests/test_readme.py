"""The README's API example runs as written (in its own process: it calls sok.init)."""
import os
import re
import subprocess
import sys
from conftest import subprocess_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_readme_api_example_runs(tmp_path):
    with open(os.path.join(ROOT, "README.md")) as handle:
        readme = handle.read()
    code = re.search(r"## API\n\n```python\n(.*?)```", readme, re.S).group(1)
    script = tmp_path / "example.py"
    script.write_text(code + "\nprint('OK', a.shape, d.shape, rows.shape, interaction.shape)\n")
    env = subprocess_env()
    result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "OK (3, 16) (3, 16) (2, 2, 16) (8, 367)" in result.stdout

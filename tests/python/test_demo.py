"""The main-job demo (examples/demo.py) runs end to end in a short mode:
every state format trains, the table's memory column is right, and the PNG
is written."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_demo_short_run(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "curves.png"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # the lowbit this test run imports
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py"), "--steps", "150", "--out", str(out)],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = proc.stdout
    for label in ("AdamW fp32", "AdamW bf16", "AdamW 8-bit", "AdamW 4-bit", "AdamW fp8", "Lion 8-bit"):
        assert label in text
    rows = {line[:12].strip(): line.split() for line in text.splitlines()
            if line[:12].strip() in ("AdamW fp32", "AdamW bf16", "AdamW 8-bit", "AdamW 4-bit") and "%" in line}
    bpp = {k: float(v[-3]) for k, v in rows.items()}  # state bytes per parameter column
    assert bpp["AdamW fp32"] == 8.0 and bpp["AdamW bf16"] == 4.0
    assert bpp["AdamW fp32"] > bpp["AdamW bf16"] > bpp["AdamW 8-bit"] > bpp["AdamW 4-bit"]
    assert out.exists() and out.stat().st_size > 10_000
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert str(out) in text

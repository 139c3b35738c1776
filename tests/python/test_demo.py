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


def test_demo_plot_tells_every_series_apart():
    """Issue 45 item 14: the loss plot has one panel per optimizer family,
    and inside a panel every state format has its own colour and line style
    (the same in every panel), none of them the baseline's grey."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("lowbit_demo", ROOT / "examples" / "demo.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    families = [f for f, _ in demo.FAMILIES]
    assert {run[1] for run in demo.RUNS} == set(families)
    assert len(set(demo.FAMILY_COLOURS[f] for f in families)) == len(families)
    assert len(set(demo.FORMAT_STYLES.values())) == len(demo.FORMAT_STYLES)
    for family in families:
        states = [run[2] for run in demo.RUNS if run[1] == family]
        assert all(s in demo.FORMAT_STYLES for s in states), states
        styles = [demo.FORMAT_STYLES[s] for s in states]
        assert len(set(styles)) == len(styles) and all(c != "0.6" for c, _ in styles), family

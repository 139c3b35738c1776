"""Muon on the char-level transformer of bench/convergence (issue 35), the
short variant of bench/convergence/muon_gap.py: block matrices with Muon,
the rest with AdamW in the same optimizer, 300 steps, seed 0. lowbit's fp32
Muon must end where torch.optim.Muon (+ torch.optim.AdamW) ends; 8-bit
momentum within issue 35's 1% of fp32 Muon. 4-bit momentum misses that target
(bench/NOTES.md, "Muon with low-bit momentum": +2.2% at 600 steps, +8.2% at
3000); its bound here only catches a broken 4-bit path. About 30 s on one
core; marked exhaustive (CI runs it through scripts/test.sh --all)."""

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch.optim, "Muon"):
    pytest.skip("torch.optim.Muon needs torch >= 2.9", allow_module_level=True)
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "convergence"))

import char_lm  # noqa: E402
from muon_gap import CONFIGS  # noqa: E402

STEPS = 300
# config -> largest gap to lowbit's fp32 Muon allowed, percent
BOUNDS = {"torch": 0.1, "8bit": 1.0, "4bit": 5.0}


@pytest.fixture(scope="module")
def reference():
    torch.set_num_threads(1)
    data = char_lm.dataset()
    return data, char_lm.train(CONFIGS["fp32"], STEPS, 0, data)


@pytest.mark.exhaustive
@pytest.mark.parametrize("config", sorted(BOUNDS))
def test_muon_stays_near_fp32(reference, config):
    data, ref = reference
    loss = char_lm.train(CONFIGS[config], STEPS, 0, data)
    gap = 100.0 * (loss - ref) / ref
    print(f"{config}: val loss {loss:.4f} against lowbit fp32 Muon {ref:.4f}: {gap:+.2f}%")
    assert abs(gap) <= BOUNDS[config], f"{config} ends {gap:+.2f}% from fp32 Muon after {STEPS} steps"

"""What the scripts of bench/convergence set before importing lowbit: this
folder on sys.path, the library of ./build when LOWBIT_LIBRARY is unset, and
the package from bindings/."""

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
if not os.environ.get("LOWBIT_LIBRARY") and (ROOT / "build" / "liblowbit.so").exists():
    os.environ["LOWBIT_LIBRARY"] = str(ROOT / "build" / "liblowbit.so")
sys.path.insert(0, str(ROOT / "bindings"))

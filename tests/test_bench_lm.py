"""scripts/bench_lm.py, run briefly (`--quick`: a tiny GPT2CausalLM, one block per case). Before timing, the
script holds keras_hub's own fit and the trainer (Keras' Adam) to the same losses on the same two batches, and
stops if they differ. (The full run and its figures: docs/benchmarks.md.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import EXTENDED

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_lm.py"


@EXTENDED  # the suite's time: GPT2CausalLM trains like keras_hub's own Keras every time (tests/test_keras_hub.py)
def test_bench_lm_quick_checks_the_same_math_and_prints_tokens_per_second():
    cases = ["keras", "chain1k"]  # chain1k holds the trainer to keras_hub's fit; the cut cases run the same block
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--cases", *cases], capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    rows = {line.split()[0]: line.split() for line in r.stdout.splitlines() if line.split()[:1] in ([c] for c in cases)}
    assert set(rows) == set(cases)
    assert all(float(row[1]) > 0 for row in rows.values())  # tokens/s
    assert rows["chain1k"][2] == "keras" and float(rows["chain1k"][3]) > 0  # a ratio to keras

"""The precise SSE emitter, kept at its old path for scripts that start it from here: the one copy lives in
``local_target/precise_emitter.py`` (shipped in the wheel, used by ``loadgen bench-client``).

    taskset -c 0 python bench/precise_emitter.py --ttft-ms 20 --itl-ms 5 --log writes.json
    python -m local_target.precise_emitter --cpu 0 --ttft-ms 20 --itl-ms 5 --log writes.json   # the same
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from local_target.precise_emitter import main  # noqa: E402

if __name__ == "__main__":
    main()

"""``loadgen advise RUN_DIR``: read a run directory, ask the what-if (``advise/whatif.py``), write advice.json
and advice.md beside the run's records and rebuild report.html with its advice section."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from loadgen.advise.whatif import AdviceError, AdviseOptions, RunData, advise
from loadgen.analysis.advice_result import Advice
from loadgen.core.secrets import write_text
from loadgen.report.advice_report import markdown
from loadgen.run.reporting import RunDirError, add_advice_section, read_run_info, read_whole_records, stored_summary
from loadgen.records.scan import load_server_metrics


def read_run(run_dir: Path) -> RunData:
    """run.json, the records and the scraped server metrics; AdviceError for what is not a run directory."""
    try:
        info, scenario = read_run_info(run_dir)
        requests, chunks = read_whole_records(run_dir)
    except RunDirError as exc:
        raise AdviceError(str(exc)) from None
    stored = stored_summary(run_dir)  # the measured run's own summary: not analysed again
    return RunData(info, scenario, requests, chunks, load_server_metrics(run_dir), str(run_dir),
                   stored[0] if stored is not None else None)


def advise_run(run_dir: Path, opts: AdviseOptions, progress: Callable[[str], None] = lambda line: None,
               png: bool = True) -> Advice:
    opts.check()  # bad --replays or --margin: before the run directory is read
    advice = advise(read_run(run_dir), opts, progress)
    write_text(run_dir / "advice.json", json.dumps(advice.to_dict(), indent=2) + "\n")
    write_text(run_dir / "advice.md", markdown(advice))
    progress("report.html: adding the advice section")
    add_advice_section(run_dir, png=png and (run_dir / "charts").is_dir())
    return advice

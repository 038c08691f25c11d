"""The scenarios shipped in the package (``loadgen.scenarios``: the clone's top-level ``scenarios/`` folder,
mapped there by setup.py), so ``loadgen scenario list|show|copy`` and ``loadgen run long_context`` work from an
installed wheel. From a clone whose editable install predates that mapping, the clone's ``scenarios/`` beside
the ``loadgen`` package is read instead (the same files)."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

SCHEMA = "scenario.schema.json"
SAMPLE_DATASETS = {"sharegpt-sample": "data/sharegpt_sample.json"}  # --dataset's shipped files
_DATA_REF = re.compile(r"(?<![\w/.-])(data/[\w.-]+)")


def folder() -> Path:
    """The folder of the bundled scenarios (a plain directory in a wheel or editable install)."""
    try:
        return Path(str(resources.files("loadgen.scenarios")))
    except ModuleNotFoundError:
        return Path(__file__).resolve().parents[2] / "scenarios"


def names() -> list[str]:
    """Every bundled scenario's name (its file name without .yaml), sorted."""
    return sorted(p.stem for p in folder().glob("*.yaml"))


def path(name: str) -> Path:
    """The bundled scenario's file; ValueError naming the choices when there is none."""
    file = folder() / f"{name.removesuffix('.yaml')}.yaml"
    if not file.is_file():
        raise ValueError(f"no bundled scenario {name!r}; the bundled ones: {', '.join(names())} "
                         "(loadgen scenario list)")
    return file


def text(name: str) -> str:
    return path(name).read_text(encoding="utf-8")


def summary(name: str) -> tuple[str, float | None]:
    """The scenario's description and its wall time in seconds (warm-up + duration), where its load says so."""
    import yaml  # here: `loadgen run -h` imports this module, and needs no YAML

    data = yaml.safe_load(text(name))
    load = data.get("load") or {}
    seconds = [load.get(k) for k in ("warmup_s", "duration_s")]
    wall = sum(float(s) for s in seconds if isinstance(s, (int, float))) if load.get("duration_s") else None
    return str(data.get("description") or ""), wall


def data_files(name: str) -> list[str]:
    """The bundled data files (``data/…``, relative to the scenario) the scenario refers to."""
    found = sorted(set(_DATA_REF.findall(text(name))))
    return [ref for ref in found if (folder() / ref).is_file()]


def resolve_scenario_arg(arg: Path) -> Path:
    """``loadgen run ARG``: the file ARG when it exists, else the bundled scenario of that name
    (``long_context`` or ``long_context.yaml``), else ARG (the loader's "cannot read" names it)."""
    if arg.exists() or arg.parent != Path("."):
        return arg
    try:
        return path(arg.name)
    except ValueError:
        return arg


def dataset_path(value: Path) -> Path:
    """--dataset: a shipped sample by name (``sharegpt-sample``), else the path as given."""
    ref = SAMPLE_DATASETS.get(str(value))
    return folder() / ref if ref is not None and not value.exists() else value


__all__ = ["SAMPLE_DATASETS", "SCHEMA", "data_files", "dataset_path", "folder", "names", "path",
           "resolve_scenario_arg", "summary", "text"]

"""Packaging beside pyproject.toml (which holds the metadata): the packages, plus the top-level ``scenarios/``
folder shipped inside the wheel as ``loadgen.scenarios`` (its YAML, the schema and ``data/``), so ``loadgen
scenario list|show|copy`` and ``loadgen run long_context`` work from an installed wheel without the clone.
Editable installs map ``loadgen.scenarios`` to ``scenarios/`` too (setuptools follows ``package_dir``)."""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["loadgen", "loadgen.*", "local_target", "local_target.*"])
    + ["loadgen.scenarios"],
    package_dir={"loadgen.scenarios": "scenarios"},
    # ci/: the nightly workflow (`loadgen scenario workflow`); the simulator's README, which its help points to
    package_data={"loadgen.scenarios": ["*.yaml", "*.json", "data/*", "ci/*"], "local_target.sim": ["README.md"]},
)

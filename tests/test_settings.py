"""Every SYNTHKD_* variable is listed and read in one module (synthkd_contract/settings.py); the optional roots'
three states are explicit."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from synthkd_assets.core.layout import DataLayout, configured_root
from synthkd_assets.defs.resources import SynthKDLayout
from synthkd_contract import settings as env
from synthkd_contract.settings import VARIABLES, SettingError, Settings

REPO = Path(__file__).resolve().parents[1]
SHIPPED = ("synthkd_assets", "synthkd_contract", "synthkd_training", "synthkd_dev")
SETTINGS_MODULE = REPO / "synthkd_contract" / "settings.py"
# what the shipped packages may still read from the environment themselves: none of them is synthkd's
OTHER_VARIABLES = {"DAGSTER_HOME", "XDG_CACHE_HOME", "O200K_HARMONY_VOCAB_PATH", "ARROW_DEFAULT_MEMORY_POOL"}
NAME = re.compile(r"\bSYNTHKD_[A-Z0-9_]*[A-Z0-9]\b")


def _python_files() -> list[Path]:
    return [path for package in SHIPPED for path in sorted((REPO / package).rglob("*.py"))]


def _environment_reads(path: Path) -> list[tuple[int, str]]:
    """(line, key source) of every `<...environ>.get(key)`, `<...environ>[key]` and `os.getenv(key)` in `path`."""
    reads = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            owner = ast.unparse(node.func.value)
            if (node.func.attr == "get" and owner.endswith("environ")) or node.func.attr == "getenv":
                reads.append((node.lineno, ast.unparse(node.args[0])))
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value).endswith("environ"):
            if isinstance(node.ctx, ast.Load):
                reads.append((node.lineno, ast.unparse(node.slice)))
    return reads


def _constant_values(path: Path) -> dict[str, str]:
    """Module-level NAME = "literal" assignments of `path`, and NAME = <Variable>.name ones resolved."""
    by_variable = {
        f"env.{name}.name": value.name for name, value in vars(env).items() if isinstance(value, env.Variable)
    }
    values = {}
    for node in ast.parse(path.read_text()).body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        target = node.target if isinstance(node, ast.AnnAssign) and node.value is not None else target
        if isinstance(target, ast.Name):
            source = ast.unparse(node.value)
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                values[target.id] = node.value.value
            elif source in by_variable:
                values[target.id] = by_variable[source]
    return values


def test_no_shipped_module_but_settings_reads_a_synthkd_variable():
    constants = {}
    for path in _python_files():
        constants.update(_constant_values(path))
    offenders = []
    for path in _python_files():
        if path == SETTINGS_MODULE:
            continue
        for line, key in _environment_reads(path):
            name = constants.get(key.split(".")[-1], key.strip("'\""))
            if name not in OTHER_VARIABLES:
                offenders.append(f"{path.relative_to(REPO)}:{line} reads {key} ({name})")
    assert not offenders, "read through synthkd_contract.settings.Settings instead:\n" + "\n".join(offenders)


def test_the_settings_module_reads_the_environment_it_is_given():
    reads = _environment_reads(SETTINGS_MODULE)
    assert reads == [(reads[0][0], "variable.name")], reads


def test_every_variable_named_anywhere_is_listed_and_documented():
    listed = {variable.name for variable in VARIABLES}
    assert len(listed) == len(VARIABLES)
    sources = [*_python_files(), *(REPO / "deploy").rglob("*.yaml"), *(REPO / "deploy").rglob("*.sh")]
    sources += [REPO / "scripts" / "build.sh", REPO / "README.md", *(REPO / "docs").glob("*.md")]
    named = {name: path for path in sources for name in NAME.findall(path.read_text())}
    unlisted = {name: str(path.relative_to(REPO)) for name, path in named.items() if name not in listed}
    assert not unlisted, f"not in synthkd_contract/settings.py's VARIABLES: {unlisted}"
    design = (REPO / "docs" / "design.md").read_text()
    table = design.split("### Environment variables", 1)[1].split("\n## ", 1)[0]
    assert not [name for name in listed if f"`{name}`" not in table]


def test_unset_and_empty_are_the_default_and_values_are_parsed_once():
    assert Settings.read({}) == Settings.read({name.name: "" for name in VARIABLES}) == Settings()
    read = Settings.read(
        {
            env.RAW_DIR.name: "/raw",
            env.HARMONY_RANGE_ROW_GROUPS.name: "7",
            env.PARALLEL_RUNS.name: " 3 ",
            env.REBUILD_CRON.name: "*/5 * * * *",
            "UNRELATED": "x",
        }
    )
    assert (read.raw_dir, read.harmony_range_row_groups, read.parallel_runs) == ("/raw", 7, 3)
    assert read.rebuild_cron == "*/5 * * * *" and read.executor == env.DEFAULT_EXECUTOR


@pytest.mark.parametrize("variable", [env.PARALLEL_RUNS, env.HARMONY_RANGE_ROW_GROUPS])
@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5"])
def test_a_number_that_is_not_a_whole_number_is_refused_naming_the_variable(variable, value):
    with pytest.raises(SettingError, match=f"^{variable.name}='{re.escape(value)}': expected a whole number"):
        Settings.read({variable.name: value})


def test_the_optional_roots_three_states_are_explicit(tmp_path, monkeypatch):
    environment = tmp_path / "sources"
    assert configured_root(None, environment) == environment  # unset: the environment's
    assert configured_root(None, None) is None
    assert configured_root("", environment) is None  # "": none, whatever the environment says
    assert configured_root(str(tmp_path / "mine"), environment) == tmp_path / "mine"
    monkeypatch.setenv(env.SOURCES_DIR.name, str(environment))
    monkeypatch.setenv(env.DATA_DIR.name, str(tmp_path / "data"))
    assert SynthKDLayout().data_layout().sources_root == environment
    assert SynthKDLayout(sources_dir="").data_layout().sources_root is None
    assert DataLayout.from_environ({env.SOURCES_DIR.name: ""}).sources_root is None

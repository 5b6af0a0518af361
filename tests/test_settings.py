"""Settings: strict parsing of GEMMTUNE_* variables, validation shared with arguments, effort presets,
the strategy names core keeps in step with gemmtune.search, and the generated docs/SETTINGS.md table."""

from __future__ import annotations

from pathlib import Path

import pytest

import gemmtune
from gemmtune.core.errors import BackendError, GemmtuneError, InputError, SettingsError
from gemmtune.core.settings import (EFFORT_NAMES, EFFORTS, STRATEGY_NAMES, Effort, Settings, check_backends,
                                    env_var, merge_effort, parse_runtime)
from gemmtune.core.settings_doc import settings_table

DOC = Path(__file__).resolve().parents[1] / "docs" / "SETTINGS.md"


def env_error(var: str, raw: str, error: type[Exception] = SettingsError) -> str:
    """The message of the error `var=raw` raises; asserts it names the variable."""
    with pytest.raises(error) as info:
        Settings.from_env({var: raw})
    assert str(info.value).startswith(f"{var} ("), str(info.value)
    return str(info.value)


# -- one test per rejected kind: each error names the variable ----------------------------------------------

@pytest.mark.parametrize("raw", ["ture", "2", "y", "enabled", "-1"])
def test_a_misspelt_boolean_is_refused_not_read_as_false(raw):
    msg = env_error("GEMMTUNE_CHECK_CORRECTNESS", raw)
    assert "expected a boolean (1/0, true/false, yes/no, on/off)" in msg and repr(raw) in msg


@pytest.mark.parametrize("var", ["GEMMTUNE_CPU_REP_MS", "GEMMTUNE_GPU_REP_MS", "GEMMTUNE_BUDGET_S",
                                 "GEMMTUNE_COMPILE_TIMEOUT_S", "GEMMTUNE_RUN_TIMEOUT_S", "GEMMTUNE_LIBRARY_MARGIN"])
@pytest.mark.parametrize("raw", ["nan", "NaN", "inf", "-inf"])
def test_nan_and_infinities_are_refused(var, raw):
    assert "must be a finite number" in env_error(var, raw)


@pytest.mark.parametrize("var", ["GEMMTUNE_CPU_REP_MS", "GEMMTUNE_BUDGET_S", "GEMMTUNE_MAX_REPS", "GEMMTUNE_MIN_REPS",
                                 "GEMMTUNE_COMPILE_WORKERS", "GEMMTUNE_TOP_X", "GEMMTUNE_FINALISTS",
                                 "GEMMTUNE_REPORT_ROWS", "GEMMTUNE_LIBRARY_MARGIN"])
def test_negatives_are_refused(var):
    assert "must be" in env_error(var, "-1")


@pytest.mark.parametrize("var", ["GEMMTUNE_BUDGET_RUNS", "GEMMTUNE_BUDGET_S", "GEMMTUNE_TOP_X", "GEMMTUNE_STAGE0_N",
                                 "GEMMTUNE_FINALISTS", "GEMMTUNE_FINALIST_ROUNDS", "GEMMTUNE_MIN_REPS",
                                 "GEMMTUNE_CPU_REP_MS", "GEMMTUNE_GPU_REP_MS", "GEMMTUNE_RUN_TIMEOUT_S",
                                 "GEMMTUNE_COMPILE_TIMEOUT_S"])
def test_zero_is_refused_where_it_means_nothing(var):
    assert "must be" in env_error(var, "0")


def test_zero_is_accepted_where_it_means_something():
    s = Settings.from_env({"GEMMTUNE_COMPILE_WORKERS": "0", "GEMMTUNE_LIBRARY_MARGIN": "0", "GEMMTUNE_REPORT_ROWS": "0"})
    assert (s.compile_workers, s.library_margin, s.report_rows) == (0, 0.0, 0)


def test_max_reps_below_min_reps_is_refused():
    assert "must be >= min_reps (5), got 3" in env_error("GEMMTUNE_MAX_REPS", "3")
    with pytest.raises(SettingsError, match=r"^max_reps: must be >= min_reps \(5\), got 3$"):
        Settings(max_reps=3)
    assert Settings.from_env({"GEMMTUNE_MIN_REPS": "1", "GEMMTUNE_MAX_REPS": "3"}).max_reps == 3


@pytest.mark.parametrize("var,raw", [("GEMMTUNE_TOP_X", "four"), ("GEMMTUNE_TOP_X", "4.5"),
                                     ("GEMMTUNE_CPU_REP_MS", "10ms"), ("GEMMTUNE_BUDGET_RUNS", "1e3")])
def test_unreadable_numbers_are_refused(var, raw):
    assert repr(raw) in env_error(var, raw)


@pytest.mark.parametrize("var,raw", [("GEMMTUNE_ISOLATION", "container"), ("GEMMTUNE_L2_FLUSH", "dirty"),
                                     ("GEMMTUNE_OVERLAP_COMPILE", "yes"), ("GEMMTUNE_CONFIG_SPACE", "huge"),
                                     ("GEMMTUNE_EFFORT", "insane")])
def test_unknown_choices_are_refused(var, raw):
    assert "expected one of" in env_error(var, raw) and repr(raw) in env_error(var, raw)


def test_unknown_strategy_and_backend_names_stay_backend_errors():
    assert "'random'" in env_error("GEMMTUNE_STRATEGY", "random", BackendError)
    assert "unknown family ['cublas']" in env_error("GEMMTUNE_BACKENDS", "extern,cublas", BackendError)


@pytest.mark.parametrize("raw,problem", [("swizzle=x", "swizzle: expected an integer, got 'x'"),
                                         ("swizzle", "expected NAME=VALUE"),
                                         ("swizzle=1,swizzle=2", "expected distinct NAME=VALUE pairs"),
                                         ("=3", "expected a parameter name")])
def test_bad_stage1_runtime_names_the_variable(raw, problem):
    assert problem in env_error("GEMMTUNE_STAGE1_RUNTIME", raw)


# -- arguments and variables share one validation -------------------------------------------------------

@pytest.mark.parametrize("name,bad", [("top_x", 0), ("budget_runs", 0), ("budget_s", float("nan")),
                                      ("cpu_rep_ms", -1.0), ("library_margin", 0.5), ("l2_flush", "dirty"),
                                      ("compile_workers", -3)])
def test_argument_and_variable_give_the_same_error(name, bad):
    with pytest.raises(SettingsError) as arg:
        Settings(**{name: bad})
    with pytest.raises(SettingsError) as env:
        Settings.from_env({env_var(name): str(bad)})
    assert str(arg.value).startswith(f"{name}: ")
    assert str(env.value) == f"{env_var(name)} ({name}): " + str(arg.value)[len(name) + 2:]


@pytest.mark.parametrize("kwargs", [dict(check_correctness="yes"), dict(top_x=2.5), dict(top_x=True),
                                    dict(gpu_rep_ms="10"), dict(store=""), dict(stage1_runtime={"swizzle": "8"})])
def test_wrongly_typed_arguments_are_refused(kwargs):
    (name,) = kwargs
    with pytest.raises(SettingsError, match=f"^{name}: "):
        Settings(**kwargs)


def test_errors_are_typed_value_errors():
    assert issubclass(SettingsError, InputError) and issubclass(SettingsError, ValueError)
    assert issubclass(SettingsError, GemmtuneError)
    with pytest.raises(ValueError, match="top_x"):
        Settings().with_(top_x=0)


# -- accepted spellings ------------------------------------------------------------------------------------

@pytest.mark.parametrize("raw,value", [(w, True) for w in ("1", "true", "TRUE", "Yes", "on", " On ")]
                         + [(w, False) for w in ("0", "false", "False", "NO", "off")])
def test_boolean_spellings(raw, value):
    assert Settings.from_env({"GEMMTUNE_CHECK_CORRECTNESS": raw}).check_correctness is value


def test_accepted_values_and_normalisation():
    s = Settings.from_env({"GEMMTUNE_BUDGET_S": " 2.5 ", "GEMMTUNE_STAGE0_N": "none", "GEMMTUNE_BACKENDS": "extern, triton",
                           "GEMMTUNE_STAGE1_RUNTIME": "swizzle=8", "GEMMTUNE_TOP_X": "", "GEMMTUNE_STORE": "off",
                           "GEMMTUNE_CPU_REP_MS": "5"})
    assert (s.budget_s, s.stage0_n, s.backends, s.stage1_runtime) == (2.5, None, ("extern", "triton"), (("swizzle", 8),))
    assert (s.top_x, s.store, s.cpu_rep_ms) == (4, "off", 5.0)  # an empty variable counts as unset
    a = Settings(cpu_rep_ms=5, backends="numba", stage1_runtime={"swizzle": 4}, lookup_table=Path("t.json"))
    assert (a.cpu_rep_ms, a.backends, a.stage1_runtime, a.lookup_table) == (5.0, ("numba",), (("swizzle", 4),), "t.json")
    assert parse_runtime("swizzle=8,group=2") == (("group", 2), ("swizzle", 8))
    assert check_backends(("extern",)) == ("extern",) and check_backends(None) is None


# -- effort presets --------------------------------------------------------------------------------------------

def test_effort_presets_are_typed_and_complete():
    assert tuple(EFFORTS) == EFFORT_NAMES and all(isinstance(e, Effort) for e in EFFORTS.values())
    assert EFFORTS["quick"].changes() == {"strategy": "model_pruned", "stage0_n": 8, "top_x": 2, "finalists": 2,
                                          "gpu_rep_ms": 5.0, "cpu_rep_ms": 10.0, "finalist_rounds": 3, "cpu_configs": 2,
                                          "library_final": False}
    with pytest.raises(SettingsError, match="effort bad: top_x: must be >= 1"):
        Effort("bad", "", top_x=0)


def test_explicit_settings_beat_the_preset_in_with_and_from_env():
    assert Settings().with_(effort="quick").top_x == 2
    assert Settings().with_(effort="quick", top_x=3).top_x == 3
    assert Settings.from_env({}, effort="quick", top_x=3).top_x == 3
    assert Settings.from_env({"GEMMTUNE_TOP_X": "3"}, effort="quick").top_x == 3
    assert Settings.from_env({"GEMMTUNE_EFFORT": "quick", "GEMMTUNE_TOP_X": "3"}).top_x == 3
    assert Settings.from_env({"GEMMTUNE_EFFORT": "max"}, strategy="prescreen").strategy == "prescreen"
    assert Settings.from_env({"GEMMTUNE_EFFORT": "max"}).config_space == "max"
    assert merge_effort({"effort": "max", "finalists": 1})["finalists"] == 1


def test_effort_error_names_the_argument_or_variable():
    with pytest.raises(SettingsError, match="^effort: expected one of quick, default, max, got 'insane'"):
        Settings().with_(effort="insane")
    env_error("GEMMTUNE_EFFORT", "insane")


def test_effort_help_says_what_each_preset_sets(capsys):
    from gemmtune.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["tune", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "quick: " in text and "stage0_n=8" in text and "top_x=2" in text  # the preset, not the old "20 configs"
    assert "stage0_n=14" in text and "strategy=exhaustive" in text and "config_space=max" in text


# -- core's strategy names and gemmtune.search never drift ---------------------------------------------------

def test_strategy_names_match_the_search_registry():
    from gemmtune.search import ALIASES, STRATEGIES

    assert set(STRATEGY_NAMES) == set(STRATEGIES) | set(ALIASES) and not set(STRATEGIES) & set(ALIASES)


# -- docs/SETTINGS.md holds exactly the generated table -------------------------------------------------------

def test_settings_doc_holds_the_current_table():
    table = settings_table()
    assert table in DOC.read_text(), (
        "docs/SETTINGS.md is out of date with the Settings specs: run `make docs` (python tools/docs.py)")
    assert gemmtune.Settings is Settings


def test_an_effort_passed_to_the_constructor_brings_its_preset():
    quick = Settings(effort="quick")
    assert (quick.top_x, quick.finalists, quick.finalist_rounds, quick.library_final) == (2, 2, 3, False)
    assert Settings(effort="quick", top_x=3).top_x == 3  # an explicit value beats the preset
    assert Settings(effort="max").strategy == "exhaustive" and Settings().top_x == 4
    assert Settings(effort="quick") == Settings().with_(effort="quick")


def test_an_explicit_default_value_stands_under_a_preset_through_with_and_the_environment():
    quick = Settings(effort="quick")
    assert quick.with_(top_x=4).top_x == 4 and quick.with_(top_x=4).effort == "quick"
    assert Settings.from_env({"GEMMTUNE_EFFORT": "quick", "GEMMTUNE_TOP_X": "4"}).top_x == 4
    assert Settings.from_env({"GEMMTUNE_EFFORT": "quick"}).top_x == 2
    assert Settings().with_(effort="max").effort == "max" and Settings().with_(effort="max").strategy == "exhaustive"


# -- settings that used to do nothing, silently ----------------------------------------------------------------

@pytest.mark.parametrize("var,closest", [("GEMMTUNE_EFORT", "GEMMTUNE_EFFORT"),
                                         ("GEMMTUNE_CHECK_CORECTNESS", "GEMMTUNE_CHECK_CORRECTNESS"),
                                         ("GEMMTUNE_CACHEDIR", "GEMMTUNE_CACHE_DIR"),
                                         ("GEMMTUNE_TOPX", "GEMMTUNE_TOP_X")])
def test_a_misspelt_variable_warns_once_naming_the_closest_setting(var, closest):
    from gemmtune.core import environment
    from gemmtune.core.errors import SettingsWarning

    environment._WARNED.discard(var)
    with pytest.warns(SettingsWarning, match=f"{var} is not a gemmtune setting and is ignored; did you mean {closest}"):
        Settings.from_env({var: "quick"})
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Settings.from_env({var: "quick"})  # once per variable


def test_variables_gemmtune_reads_do_not_warn(tmp_path):
    import warnings

    from gemmtune.core.settings import KNOWN_VARIABLES

    env = {var: "" for var in KNOWN_VARIABLES}
    env.update({"GEMMTUNE_WORKER_PROCESS": "1", "GEMMTUNE_CUTLASS_DISK": "0",
                "GEMMTUNE_CACHE_DIR": str(tmp_path), "GEMMTUNE_COMPILE_PATH": "traced", "PATH": "/bin"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Settings.from_env(env).compile_path == "traced"
    for var in ("GEMMTUNE_CACHE_DIR", "GEMMTUNE_CUTLASS_DISK", "GEMMTUNE_WORKER_PROCESS"):
        assert var in KNOWN_VARIABLES


def test_every_gemmtune_variable_the_project_names_is_known():
    """Each `GEMMTUNE_X` the source, docs, tests and bench scripts name is one gemmtune reads (no warning)."""
    import re

    from gemmtune.core.settings import KNOWN_VARIABLES

    root = DOC.parents[1]
    named = set()
    for path in [*root.glob("src/**/*.py"), *root.glob("docs/*.md"), *root.glob("bench/*.py"), root / "README.md"]:
        named |= set(re.findall(r"GEMMTUNE_[A-Z0-9_]*[A-Z0-9]", path.read_text()))
    not_read = {"GEMMTUNE_EFORT", "GEMMTUNE_CHECK_CORECTNESS"}  # docs: examples of misspelt variables
    assert named - KNOWN_VARIABLES - not_read == set()


def test_a_redis_url_is_a_store_location():
    assert Settings(store="redis://db:6379/0?prefix=a").store == "redis://db:6379/0?prefix=a"
    assert Settings.from_env({"GEMMTUNE_STORE": " REDISS://db/1 "}).store == "REDISS://db/1"


@pytest.mark.parametrize("raw,value", [("OFF", "off"), ("Off", "off"), ("MEMORY", "memory"), ("Memory", "memory"),
                                       (":memory:", "memory"), ("Default", None), ("picks.sqlite", "picks.sqlite")])
def test_store_keywords_are_read_in_any_case(raw, value, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert Settings.from_env({"GEMMTUNE_STORE": raw}).store == value
    assert Settings(store=raw).store == value
    assert list(tmp_path.iterdir()) == []  # reading a setting creates nothing


@pytest.mark.parametrize("raw,problem", [("none", "'none' is ambiguous"), ("None", "'none' is ambiguous"),
                                         ("s3://bucket/picks", "unsupported store scheme 's3://'"),
                                         ("sqlite:///tmp/x.db", "unsupported store scheme 'sqlite://'"),
                                         ("https://example.org/s", "unsupported store scheme 'https://'")])
def test_store_values_that_are_neither_keywords_nor_paths_are_refused(raw, problem):
    """Not a keyword, a path or a Redis URL (redis://, rediss://: tests/test_store_redis.py)."""
    assert problem in env_error("GEMMTUNE_STORE", raw)
    with pytest.raises(SettingsError, match=f"^store: .*{problem}"):
        Settings(store=raw)


def test_a_blank_or_directory_store_is_refused(tmp_path):
    assert "is a directory" in env_error("GEMMTUNE_STORE", str(tmp_path))
    for blank in ("   ", "\t"):
        with pytest.raises(SettingsError, match="^store: .*blank"):
            Settings(store=blank)


def test_a_blank_cache_dir_is_refused(monkeypatch, tmp_path):
    from gemmtune.core.settings import cache_dir

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SettingsError, match="^GEMMTUNE_CACHE_DIR: expected a directory, got the blank"):
        Settings.from_env({"GEMMTUNE_CACHE_DIR": "   "})
    monkeypatch.setenv("GEMMTUNE_CACHE_DIR", " ")
    with pytest.raises(SettingsError, match="^GEMMTUNE_CACHE_DIR: "):
        cache_dir()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("raw", ["ture", "2", "enabled"])
def test_cutlass_disk_is_strict_on_every_device(raw):
    with pytest.raises(SettingsError, match=f"^GEMMTUNE_CUTLASS_DISK: expected a boolean .*{raw!r}"):
        Settings.from_env({"GEMMTUNE_CUTLASS_DISK": raw})


@pytest.mark.parametrize("raw", ["swizle=8", "waves=2", "group=4,stages=3"])
def test_stage1_runtime_names_must_exist(raw):
    msg = env_error("GEMMTUNE_STAGE1_RUNTIME", raw)
    assert "unknown runtime parameter" in msg and "group, swizzle" in msg
    with pytest.raises(SettingsError, match="^stage1_runtime: unknown runtime parameter"):
        Settings(stage1_runtime=raw)
    assert "did you mean 'swizzle'" in env_error("GEMMTUNE_STAGE1_RUNTIME", "swizle=8")


def test_runtime_param_names_are_the_templates():
    from gemmtune.core.environment import RUNTIME_PARAM_NAMES
    from gemmtune.templates import default_templates
    from gemmtune.templates.cutlass import CutlassOperatorsTemplate

    templates = [*default_templates(hopper=True, preview=True), CutlassOperatorsTemplate()]
    assert set(RUNTIME_PARAM_NAMES) == {k for t in templates for k in t.runtime_space}


def test_a_relation_error_names_the_variable_that_was_set():
    msg = env_error("GEMMTUNE_MIN_REPS", "100")
    assert msg == "GEMMTUNE_MIN_REPS (min_reps): must be <= max_reps (50), got 100"
    with pytest.raises(SettingsError, match=r"^min_reps: must be <= max_reps \(50\), got 100$"):
        Settings(min_reps=100)
    with pytest.raises(SettingsError, match=r"^GEMMTUNE_MAX_REPS \(max_reps\): must be >= min_reps \(9\), got 8$"):
        Settings.from_env({"GEMMTUNE_MIN_REPS": "9", "GEMMTUNE_MAX_REPS": "8"})

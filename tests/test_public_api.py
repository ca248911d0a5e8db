"""The public API holds (docs/api.md): what the package and each layer export, DLACStrategy's and DLACCallback's
constructor arguments, read-outs and methods, and the fields of the strategy's config objects are pinned here. A
public name removed or renamed fails these tests: it keeps a deprecated alias for one release, which warns with the
new spelling, and the tests below check that every alias listed does. A public name added fails them too, until it is
pinned here and listed in docs/api.md.

The deprecated read-outs are also checked after a real 2-rank fit: tests/plugin/test_options.py,
``test_deprecated_read_outs_warn_and_return_what_their_replacements_do``.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

import lightning_dlac
from lightning_dlac import CheckpointOptions, CompressionOptions, DLACCallback, DLACStrategy, ShardingOptions

ROOT = Path(__file__).resolve().parents[1]
API_DOC = ROOT / "docs" / "api.md"
KEEP = ("a public name is removed or renamed only after one release as a deprecated alias that does what it did and"
        " warns with the new spelling (docs/api.md, 'Deprecations'): keep {what} working and warning")  # fmt: skip
ADD = "pin {what} in tests/test_public_api.py and list it in docs/api.md"

# ------------------------------------------------------------------------------------------------ the pinned surface

EXPORTS: dict[str, list[str]] = {
    "lightning_dlac": ["BackwardCompression", "CheckpointOptions", "CompressionOptions", "DLACCallback",
                       "DLACStrategy", "EmbeddingOptimizer", "ShardingOptions", "dense_parameters"],
    "lightning_dlac.codec": ["ChunkInfo", "CodecError", "Mode", "cast_column_blocks", "decode", "decode_grid",
                             "encode", "encode_grid", "impl_calls", "inspect", "inspect_grid", "max_error",
                             "native_available"],
    "lightning_dlac.adaptive": ["BoundSource", "Calibration", "CalibrationSettings", "CalibrationStats", "Calibrator",
                                "ClassBounds", "DecaySchedule", "ErrorBounds", "HomogenizationThresholds",
                                "ProbeBounds", "ScheduleKind", "TableClass", "TableStats", "check_count",
                                "check_relative_bound", "class_table_bounds", "classify", "distinct_rows",
                                "gradient_table_bounds", "homogenization_counts", "homogenization_index",
                                "noise_table_bounds", "relative_noise_budget", "sensitivity_classes",
                                "sensitivity_table_bounds", "value_homogenization_counts",
                                "value_homogenization_index"],
    "lightning_dlac.comm": ["BackwardCompression", "CommStats", "CompressedExchangeError",
                            "CompressedPooledEmbeddingsAllToAll", "CompressionConfig", "CompressionOptions",
                            "ExchangeGroup", "PeerTimeoutError", "install_compressed_all_to_all"],
    "lightning_dlac.engine": ["CheckpointOptions", "Checkpointer", "EmbeddingOptimizer", "IncompleteCheckpointError",
                              "NoEmbeddingTablesError", "Pipeline", "PipelineError", "SHARDING_TYPES",
                              "ShardingOptions", "SparseDistPipeline", "check_directory", "dense_parameters",
                              "fused_parameters", "load_sharded", "plan_summary", "remove_checkpoint",
                              "require_torchrec", "save_sharded", "shard_model"],
    "lightning_dlac.plugin": ["CompressionMonitor", "DLACCallback", "DLACStrategy"],
    "lightning_dlac.criteo": ["CRITEO_KAGGLE_CARDINALITIES", "DENSE_COLUMNS", "DENSE_NAMES", "FEATURE_NAMES",
                              "MLPERF_MULTI_HOT_SIZES", "MLPERF_NUM_EMBEDDINGS_PER_FEATURE", "SPARSE_COLUMNS",
                              "CriteoConversion", "CriteoFormatError", "CriteoRows", "MultiHotMaterialization",
                              "MultiHotMember", "binary_paths", "capped_cardinalities", "check_criteo_binary",
                              "check_criteo_multi_hot", "check_multi_hot_sizes", "dense_log1p", "dense_torchrec",
                              "materialize_multi_hot", "multi_hot_from_one_hot", "multi_hot_path",
                              "preprocess_criteo", "read_multi_hot_layout", "read_npy_header", "read_tsv",
                              "resolve_parser"],
    "lightning_dlac.native": ["ENV_DIR", "IMPLS", "NativeLibrary", "NativeUnavailable", "build_dir",
                              "build_extension", "cache_root", "sources_dir"],
    "lightning_dlac.testing": ["RanksFailed", "hosted_store", "kill_session", "run_ranks", "run_session"],
    "lightning_dlac.checks": ["check_count", "parse_enum"],
    "lightning_dlac.commands.cli": ["CLIUserError", "build_cli", "main"],  # commands/ exports nothing itself
}  # fmt: skip

# The DLAC-specific members of the two classes (Lightning's hooks they override are Lightning's API): kind by name.
MEMBERS: dict[type, dict[str, str]] = {
    DLACStrategy: {
        "sharding": "property", "compression": "property", "checkpointing": "property", "compress": "property",
        "error_bounds": "property", "exchange_group": "property", "exchanges": "property",
        "all_compressed_tables": "property", "total_comm_stats": "method", "distributed_model": "property",
        "sharding_plan": "property", "pipeline": "property", "train_pipeline": "property",
        "compressed_tables": "property", "sharding_types": "property", "embedding_optimizer": "property",
        "strategy_name": "attribute",
    },
    DLACCallback: {
        "active": "property", "calibrator": "property", "calibrated": "property", "step": "property",
        "table_bounds": "property", "classes": "property", "table_stats": "property",
        "calibration_report": "method", "rule": "method", "run_summary": "method", "calibration_seconds": "property",
        # set by the constructor
        "class_bounds": "attribute", "settings": "attribute", "schedule": "attribute", "mode": "attribute",
        "calibration_batches": "attribute", "calibration_start": "attribute", "sensitivity_batches": "attribute",
        "recalibrate_every": "attribute", "gradient_tolerance": "attribute", "calibration_dataloader": "attribute",
        "log_every_n_steps": "attribute", "prog_bar": "attribute", "report": "attribute",
    },
}  # fmt: skip

CONSTRUCTORS: dict[type, list[str]] = {
    DLACStrategy: ["accelerator", "parallel_devices", "cluster_environment", "checkpoint_io", "precision_plugin",
                   "process_group_backend", "timeout", "start_method", "sharding", "compression", "checkpointing",
                   "pipeline", "**deprecated"],
    DLACCallback: ["mode", "tight_eps", "base_eps", "loose_eps", "tight_below", "loose_from", "index_eps", "index",
                   "candidates", "sensitivity_tolerance", "gradient_tolerance", "noise_budget", "noise_fraction",
                   "calibration_batches", "calibration_start", "sensitivity_batches", "recalibrate_every",
                   "calibration_dataloader", "schedule", "c", "T", "stages", "log_every_n_steps",
                   "per_table_metrics", "prog_bar", "report"],
}  # fmt: skip

FIELDS: dict[type, list[str]] = {
    ShardingOptions: ["sharding_types", "table_constraints", "embedding_optimizer", "embedding_lr", "adagrad_epsilon",
                      "memory_budget_bytes", "find_unused_parameters", "static_graph", "bucket_cap_mb",
                      "qcomm_codecs_registry"],
    CompressionOptions: ["backward", "backward_eps", "error_every", "impl", "auto_fallback", "fallback_check_every",
                         "overlap", "compress_peers", "pieces", "enabled", "eps"],
    CheckpointOptions: ["verify"],
}  # fmt: skip

# Deprecated aliases: DLACStrategy's flat options of 0.1 -> (config parameter, field, a value other than its
# default), and the restored read-outs -> their replacement.
FLAT: dict[str, tuple[str, str, Any]] = {
    "sharding_types": ("sharding", "sharding_types", ["column_wise"]),
    "table_constraints": ("sharding", "table_constraints", {"t_cat_0": {"sharding_types": ["data_parallel"]}}),
    "embedding_optimizer": ("sharding", "embedding_optimizer", "sgd"),
    "embedding_lr": ("sharding", "embedding_lr", 0.02),
    "adagrad_epsilon": ("sharding", "adagrad_epsilon", 1e-6),
    "memory_budget_bytes": ("sharding", "memory_budget_bytes", 1 << 30),
    "find_unused_parameters": ("sharding", "find_unused_parameters", True),
    "static_graph": ("sharding", "static_graph", True),
    "bucket_cap_mb": ("sharding", "bucket_cap_mb", 4),
    "compress": ("compression", "enabled", False),
    "eps": ("compression", "eps", 0.05),
    "backward_compression": ("compression", "backward", "dlac"),
    "backward_eps": ("compression", "backward_eps", 0.02),
    "codec_impl": ("compression", "impl", "ref"),
    "error_every": ("compression", "error_every", 0),
    "fallback_check_every": ("compression", "fallback_check_every", 8),
    "overlap": ("compression", "overlap", True),
    "compress_peers": ("compression", "compress_peers", "all"),
    "pieces": ("compression", "pieces", 2),
    "verify_checkpoints": ("checkpointing", "verify", False),
}
CONFIG_CLASSES = {"sharding": ShardingOptions, "compression": CompressionOptions, "checkpointing": CheckpointOptions}
READ_OUTS = {
    "compressed_tables": "strategy.exchange_group.compressed_tables",
    "sharding_types": "strategy.sharding.sharding_types",
    "embedding_optimizer": "strategy.sharding.embedding_optimizer",
}


def _diff(what: str, pinned: list[str] | set[str], now: list[str] | set[str]) -> list[str]:
    gone, new = sorted(set(pinned) - set(now)), sorted(set(now) - set(pinned))
    problems = []
    if gone:
        problems.append(f"{what} lost {gone}; " + KEEP.format(what=", ".join(gone)))
    if new:
        problems.append(f"{what} has new {new}; " + ADD.format(what=", ".join(new)))
    return problems


# ------------------------------------------------------------------------------------------------------ the exports


def _layer_packages() -> list[str]:
    return sorted(f"lightning_dlac.{p.parent.name}" for p in (ROOT / "lightning_dlac").glob("*/__init__.py"))


def test_every_package_that_exports_names_is_pinned() -> None:
    exporting = {name for name in _layer_packages() if hasattr(importlib.import_module(name), "__all__")}
    assert exporting | {"lightning_dlac", "lightning_dlac.commands.cli"} == set(EXPORTS), (
        ADD.format(what=f"the exports of {sorted(exporting - set(EXPORTS))}"))


@pytest.mark.parametrize("module", list(EXPORTS))
def test_exports_are_the_pinned_ones_and_each_resolves(module: str) -> None:
    mod = importlib.import_module(module)
    problems = _diff(f"{module}.__all__", EXPORTS[module], mod.__all__)
    assert not problems, "\n".join(problems)
    unresolved = [name for name in mod.__all__ if not hasattr(mod, name)]
    assert not unresolved, f"{module}.__all__ lists {unresolved}, which do not resolve (a lazy export moved?)"
    lazy = getattr(mod, "_EXPORTS", None)
    if lazy is not None:  # the lazy facades: what __all__ promises is what __getattr__ can load
        assert set(lazy) == set(mod.__all__), f"{module}: _EXPORTS and __all__ differ"


def test_every_public_name_is_listed_in_docs_api() -> None:
    doc = API_DOC.read_text()
    missing = [f"{module}.{name}" for module, names in EXPORTS.items() for name in names if f"`{name}`" not in doc]
    missing += [f"{cls.__name__}.{name}" for cls, members in MEMBERS.items() for name in members
                if not re.search(rf"`{name}(\(.*?\))?`", doc)]  # fmt: skip
    assert not missing, f"docs/api.md does not list {missing}"


@pytest.mark.slow  # a fresh Python process
def test_importing_the_package_imports_neither_lightning_nor_torchrec() -> None:
    code = ("import sys, lightning_dlac; lightning_dlac.CompressionOptions, lightning_dlac.CheckpointOptions;"
            " lightning_dlac.ShardingOptions; print(sorted({m.split('.')[0] for m in sys.modules}"
            " & {'lightning', 'pytorch_lightning', 'torchrec', 'fbgemm_gpu'}))")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr[-2000:]


# ------------------------------------------------------------------------------------- the two classes' own surface


def _kind(cls: type, name: str) -> str | None:
    for klass in cls.__mro__:
        if name in vars(klass):
            value = vars(klass)[name]
            return "property" if isinstance(value, property) else "method" if callable(value) else "attribute"
    return None


@pytest.mark.parametrize("cls", list(MEMBERS), ids=lambda c: c.__name__)
def test_the_classes_members_are_the_pinned_ones(cls: type) -> None:
    base = cls.__mro__[1]
    inherited = set(dir(base)) | set(vars(base()))  # Lightning's, class or instance
    instance = cls()
    own = {n for n in [*vars(cls), *vars(instance)] if not n.startswith("_") and n not in inherited}
    problems = _diff(f"{cls.__name__}'s members", set(MEMBERS[cls]), own)
    kinds = {name: "attribute" if name in vars(instance) else _kind(cls, name) for name in MEMBERS[cls] if name in own}
    changed = {n: (MEMBERS[cls][n], k) for n, k in kinds.items() if k != MEMBERS[cls][n]}
    if changed:
        problems.append(f"{cls.__name__}: members changed kind (pinned, now): {changed}; "
                        + KEEP.format(what="the old kind"))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("cls", list(CONSTRUCTORS), ids=lambda c: c.__name__)
def test_the_constructors_take_the_pinned_arguments(cls: type) -> None:
    params = inspect.signature(cls.__init__).parameters.values()
    now = [("**" if p.kind is p.VAR_KEYWORD else "") + p.name for p in params if p.name != "self"]
    problems = _diff(f"{cls.__name__}.__init__", CONSTRUCTORS[cls], now)
    assert not problems, "\n".join(problems)
    assert now == CONSTRUCTORS[cls], f"{cls.__name__}.__init__'s arguments changed order: {now}"


@pytest.mark.parametrize("cls", list(FIELDS), ids=lambda c: c.__name__)
def test_the_config_objects_have_the_pinned_fields(cls: type) -> None:
    problems = _diff(f"{cls.__name__}'s fields", FIELDS[cls], [f.name for f in dataclasses.fields(cls)])
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------------------------- the deprecated aliases


def test_every_flat_option_of_0_1_is_pinned_and_in_docs_api() -> None:
    from lightning_dlac.plugin._deprecated import FLAT_OPTIONS

    problems = _diff("DLACStrategy's deprecated flat options", set(FLAT), set(FLAT_OPTIONS))
    assert not problems, "\n".join(problems)
    rows = {m[0]: m[1:] for m in re.findall(r"^\| `(\w+)` \| `(\w+)=(\w+)\((\w+)=", API_DOC.read_text(), flags=re.M)}
    want = {flat: (group, CONFIG_CLASSES[group].__name__, field) for flat, (group, field, _) in FLAT.items()}
    assert rows == want, "docs/api.md's table of the flat options differs from the code"


@pytest.mark.parametrize("flat", list(FLAT))
def test_a_flat_option_warns_with_its_new_spelling_and_configures_what_the_new_spelling_does(flat: str) -> None:
    group, field, value = FLAT[flat]
    new = DLACStrategy(**{group: CONFIG_CLASSES[group](**{field: value})})
    with pytest.warns(DeprecationWarning) as caught:
        old = DLACStrategy(**{flat: value})
    (warning,) = [w for w in caught if "is deprecated" in str(w.message)]
    message = str(warning.message)
    spelled = f"{group}={CONFIG_CLASSES[group].__name__}({field}="
    assert message.startswith(f"DLACStrategy({flat}=") and f"use DLACStrategy({spelled}" in message, message
    assert f"init_args.{group}.{field}" in message, message
    assert warning.filename == __file__, f"the warning points at {warning.filename}, not at the caller's line"
    for name in CONFIG_CLASSES:
        assert getattr(old, name) == getattr(new, name), name
    assert old.error_bounds.default_eps == new.error_bounds.default_eps
    assert old.compress == new.compress and old.checkpointing.verify == new.checkpointing.verify


def test_the_flat_compress_values_map_to_enabled_and_auto_fallback() -> None:
    for value, expected in ((True, CompressionOptions()), (False, CompressionOptions(enabled=False)),
                            ("auto", CompressionOptions(auto_fallback=True))):
        with pytest.warns(DeprecationWarning, match="is deprecated"):
            assert DLACStrategy(compress=value).compression == expected, value
    with pytest.raises(ValueError, match="compress='sometimes' is not supported; choose true, false or 'auto'"):
        DLACStrategy(compress="sometimes")


def test_several_flat_options_give_one_warning_that_writes_the_new_call() -> None:
    with pytest.warns(DeprecationWarning) as caught:
        DLACStrategy(eps=0.05, embedding_lr=0.02, verify_checkpoints=False)
    (message,) = [str(w.message) for w in caught if "is deprecated" in str(w.message)]
    assert ("use DLACStrategy(sharding=ShardingOptions(embedding_lr=0.02), compression=CompressionOptions(eps=0.05),"
            " checkpointing=CheckpointOptions(verify=False))") in message, message


@pytest.mark.parametrize("flat", ["eps", "embedding_lr", "verify_checkpoints", "compress"])
def test_a_setting_given_flat_and_in_its_config_object_is_refused(flat: str) -> None:
    group, field, value = FLAT[flat]
    given = CONFIG_CLASSES[group](**{field: value})
    other = {"eps": 0.03, "embedding_lr": 0.01, "verify_checkpoints": True, "compress": True}[flat]
    with pytest.raises(ValueError, match=re.escape(f"DLACStrategy({flat}=...) and {group}=")):
        DLACStrategy(**{group: given, flat: other})
    # A flat option for another field of the same object is no conflict: it is applied beside the object's own.
    another = {"sharding": "bucket_cap_mb", "compression": "pieces"}.get(group)
    if another is not None:
        with pytest.warns(DeprecationWarning):
            mixed = DLACStrategy(**{group: given, another: FLAT[another][2]})
        assert getattr(getattr(mixed, group), field) == getattr(given, field)
        assert getattr(getattr(mixed, group), FLAT[another][1]) == FLAT[another][2]


def test_a_flat_value_the_config_object_rejects_names_the_old_and_the_new_spelling() -> None:
    both = r"eps=2\.0 is out of range.*given as the deprecated DLACStrategy\(eps=\.\.\.\), now compression="
    with pytest.raises(ValueError, match=both + r"CompressionOptions\(eps=\.\.\.\)"):
        DLACStrategy(eps=2.0)


def test_an_unknown_keyword_or_a_config_of_another_type_is_refused_with_the_fix() -> None:
    with pytest.raises(TypeError, match=r"DLACStrategy.__init__\(\) got an unexpected keyword argument 'epz'"):
        DLACStrategy(epz=0.1)
    from lightning_dlac.comm import CompressionConfig

    with pytest.raises(TypeError, match=r"takes a lightning_dlac.CompressionOptions, got CompressionConfig: write"
                                        r" DLACStrategy\(compression=CompressionOptions\(\.\.\.\)\)"):
        DLACStrategy(compression=CompressionConfig())
    with pytest.raises(TypeError, match=r"takes a lightning_dlac.ShardingOptions, got dict"):
        DLACStrategy(sharding={"embedding_lr": 0.02})


def test_a_config_object_changed_after_construction_does_not_change_the_strategy() -> None:
    compression = CompressionOptions(eps=0.05)
    strategy = DLACStrategy(compression=compression)
    compression.eps = 0.2
    assert strategy.compression.eps == 0.05 and strategy.compression is not compression
    shared = inspect.signature(DLACStrategy.__init__).parameters["compression"].default
    assert DLACStrategy().compression is not shared and DLACStrategy().compression == shared


@pytest.mark.parametrize("name", list(READ_OUTS))
def test_a_restored_read_out_warns_with_its_replacement_and_returns_what_it_did(name: str) -> None:
    strategy = DLACStrategy(sharding=ShardingOptions(embedding_optimizer="sgd", sharding_types=["column_wise"]))
    with pytest.warns(DeprecationWarning, match=re.escape(f"DLACStrategy.{name} is deprecated; use {READ_OUTS[name]}")):
        value = getattr(strategy, name)
    # before setup (the 2-rank fit's values: tests/plugin/test_options.py)
    assert value == {"compressed_tables": [], "sharding_types": ["column_wise"], "embedding_optimizer": "sgd"}[name]
    assert API_DOC.read_text().count(f"| `strategy.{name}` | `{READ_OUTS[name]}`") == 1, "docs/api.md's table"


def test_the_new_spelling_warns_nothing() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        strategy = DLACStrategy(sharding=ShardingOptions(embedding_lr=0.02), compression=CompressionOptions(eps=0.05),
                                checkpointing=CheckpointOptions(verify=False), pipeline=None)
        for name in MEMBERS[DLACStrategy]:
            if name not in READ_OUTS and MEMBERS[DLACStrategy][name] == "property":
                getattr(strategy, name)


# ------------------------------------------------------------------------ Trainer(strategy="dlac"), without a cycle


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth (inside functions and TYPE_CHECKING blocks too)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return out


def test_the_registration_and_the_strategy_do_not_import_each_other() -> None:
    """The registration imports the strategy (lazily, in the factory Trainer(strategy="dlac") calls); the strategy
    never imports the registration, not even inside a function."""
    plugin = ROOT / "lightning_dlac" / "plugin"
    assert "lightning_dlac.plugin.registration" not in _imports(plugin / "strategy.py")
    assert not any(name.endswith(".registration") or name == "lightning_dlac.plugin.registration"
                   for name in _imports(plugin / "strategy.py"))  # fmt: skip
    import lightning.pytorch as pl

    t = pl.Trainer(strategy="dlac", accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                   enable_model_summary=False, enable_checkpointing=False)
    assert type(t.strategy) is DLACStrategy


def test_the_package_exports_resolve_to_the_classes_the_layers_define() -> None:
    from lightning_dlac.comm import CompressionConfig
    from lightning_dlac.engine import CheckpointOptions as EngineCheckpointOptions
    from lightning_dlac.engine import ShardingOptions as EngineShardingOptions

    assert issubclass(lightning_dlac.CompressionOptions, CompressionConfig)
    assert lightning_dlac.ShardingOptions is EngineShardingOptions
    assert lightning_dlac.CheckpointOptions is EngineCheckpointOptions

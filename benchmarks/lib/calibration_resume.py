"""Continuing and reusing long calibration runs: ``--resume`` (an earlier file's worlds kept, the rest run) and
``--baselines-from`` (an earlier run's baseline arms reused, spot-checked where its processor was not recorded), with
every earlier part recorded in the new file's metadata.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.lib.calibration_arms import BASELINES, run_world
from benchmarks.lib.launch import run_ranks
from benchmarks.lib.results import load_results


def record_resumed(metadata: dict[str, Any], earlier: dict[str, Any], **part: Any) -> None:
    """Record under ``metadata["resumed_from"]`` the parts an earlier file's run (``earlier``: its metadata) was
    made of, then that run itself (its command, commit, dates, processor and ``part``)."""
    metadata["resumed_from"] = [*earlier.get("resumed_from", []),
                                {k: earlier.get(k) for k in ("command", "git_commit", "date", "finished", "wall_s",
                                                             "cpu")} | part]


def config_differs(old: dict[str, Any], cfg: dict[str, Any], may_grow: tuple[str, ...] = ()) -> list[str]:
    """The options an earlier run's configuration ``old`` holds otherwise than this run's ``cfg``, for ``--resume``:
    the worlds (``seeds``) may differ, and a count named in ``may_grow`` may be larger in this run (never smaller)."""
    grown = {k for k in may_grow if isinstance(old.get(k), int) and isinstance(cfg.get(k), int) and old[k] <= cfg[k]}
    return sorted(k for k in (set(cfg) | set(old)) - {"seeds", "seeds_planned", "train_seeds_planned", *grown}
                  if old.get(k) != cfg.get(k))


def resumed_worlds(path: Path, cfg: dict[str, Any], metadata: dict[str, Any],
                   may_grow: tuple[str, ...] = ()) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The worlds (and their arms' runs) that an earlier run of the same protocol wrote to ``path``, for ``--resume``:
    a run of many hours continues where it stopped instead of starting again. The earlier file must hold the same
    configuration but for its worlds, and only worlds this run plans; ``metadata`` records each earlier part's
    command, commit and dates under ``resumed_from``. A count named in ``may_grow`` (``train_seeds``) may be larger
    in this run than in the file: the caller runs what the file lacks (never smaller: runs would be dropped)."""
    if not path.exists():
        return [], []
    old = load_results(path)
    differ = config_differs(old["config"], cfg, may_grow)
    if differ:
        raise SystemExit(f"--resume: {path} was written under another configuration ({', '.join(differ)} differ);"
                         " rerun with the same options or choose another --json-out")
    per_world = old.get("per_world") or []
    foreign = sorted({w["world"] for w in per_world} - set(cfg["seeds"]))
    if foreign:
        raise SystemExit(f"--resume: {path} holds worlds {foreign} this run does not plan; widen --first/--count")
    record_resumed(metadata, old["metadata"], worlds=[w["world"] for w in per_world],
                    **{k: old["config"][k] for k in ("train_seeds", "train_seeds_planned") if k in old["config"]})
    print(f"resuming: {len(per_world)} world(s) already in {path}: {[w['world'] for w in per_world]}", flush=True)
    return per_world, list(old["results"])


def reused_baselines(path: Path, cfg: dict[str, Any],
                     metadata: dict[str, Any]) -> dict[int, dict[int, dict[str, dict[str, Any]]]]:
    """The baseline arms (BASELINES) of every world and training seed that an earlier ``--worlds`` run of the same
    protocol wrote to ``path``, for ``--baselines-from``: judging a new calibrated variant then runs only that
    variant, a quarter of a world's arms. Every launch is deterministic given its world, training seed and options
    (the same seed gives the same AUROC to the last digit), so a baseline arm of the earlier run is the arm this run
    would launch, as long as nothing that the baselines run has changed since (the file's commit, recorded here under
    ``baselines_from``, says where they were run). The protocol must match but for the worlds, variants and default
    mode; returns ``{world: {train_seed: {variant: run}}}`` for worlds whose every training seed has every baseline.

    Deterministic means on one kind of processor: the same arm run on an AMD EPYC and on an Intel Xeon parts (the
    floating-point sums differ and training amplifies them, development world 20's all-tight arm by 0.002 AUROC), so
    a part of the file run on another processor than this run's is refused, and a part whose processor was not
    recorded (resumed parts before it was) is spot-checked by :func:`spot_check_baselines` before any arm runs
    (a part that fails it is run here in full)."""
    old = load_results(path)
    keys = (set(cfg) | set(old["config"])) - {"seeds", "seeds_planned", "variants", "default_mode", "default_rule"}
    differ = sorted(k for k in keys if old["config"].get(k) != cfg.get(k))
    if differ:
        raise SystemExit(f"--baselines-from: {path} was run under another protocol ({', '.join(differ)} differ);"
                         " give the options it was run with")
    other = sorted({str(p["cpu"]) for p in _parts(old) if p["cpu"] is not None and p["cpu"] != metadata.get("cpu")})
    if other:
        raise SystemExit(f"--baselines-from: parts of {path} ran on {other}, this run on {metadata.get('cpu')!r}:"
                         " runs repeat to the last digit on one kind of processor only, so those baselines cannot"
                         " pair with this run's arms; run every arm here (leave out --baselines-from)")
    found: dict[int, dict[int, dict[str, dict[str, Any]]]] = {}
    for r in old["results"]:
        if r.get("variant") in BASELINES:
            r = dict(r, reused_from=r.get("reused_from") or old["metadata"].get("git_commit"))
            found.setdefault(r["world"], {}).setdefault(r["train_seed"], {})[r["variant"]] = r
    complete = {w: seeds for w, seeds in found.items()
                if sorted(seeds) == list(range(cfg["train_seeds"])) and all(set(BASELINES) <= set(v)
                                                                          for v in seeds.values())}
    metadata["baselines_from"] = {"path": str(path), **{k: old["metadata"].get(k) for k in
                                                        ("command", "git_commit", "date", "cpu")},
                                  "worlds": sorted(w for w in complete if w in cfg["seeds"]),
                                  "unrecorded_cpu_worlds": [p["worlds"] for p in _parts(old) if p["cpu"] is None]}
    print(f"--baselines-from: the baselines of {len(metadata['baselines_from']['worlds'])} world(s) come from"
          f" {path} (commit {old['metadata'].get('git_commit')})", flush=True)
    return complete


def _parts(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The parts of a (possibly resumed) --worlds results file: per part, the processor it ran on (None where not
    recorded) and the worlds it added."""
    m, parts, seen = data["metadata"], [], set()
    for part in m.get("resumed_from", []) + [{"cpu": m.get("cpu"), "worlds": [w["world"] for w in
                                                                               data.get("per_world") or []]}]:
        added = [w for w in part.get("worlds") or [] if w not in seen]
        seen.update(added)
        parts.append({"cpu": part.get("cpu"), "worlds": added})
    return parts


def spot_check_baselines(cfg: dict[str, Any], reused: dict[int, dict[int, dict[str, dict[str, Any]]]],
                         metadata: dict[str, Any], timeout: float,
                         done: Sequence[int] = ()) -> dict[int, dict[int, dict[str, dict[str, Any]]]]:
    """Before reusing baselines from parts whose processor was not recorded, rerun one of each such part's baseline
    arms here (the uncompressed arm of the part's first reused world still to run, training seed 0; ``done``: the
    worlds a resumed file already holds) and require the same AUROC and length to the last digit. A part that fails
    ran elsewhere (or on other code): its worlds are dropped from the reuse and run every arm here. Returns the
    baselines still reused; records every check, and the dropped worlds, under ``baselines_from``."""
    checks, dropped = [], []
    for worlds in metadata["baselines_from"]["unrecorded_cpu_worlds"]:
        world = next((w for w in worlds if w in reused and w in cfg["seeds"] and w not in done), None)
        if world is None:
            continue
        old = reused[world][0]["uncompressed"]
        new = run_ranks(run_world, 2, "uncompressed", dict(cfg, world=world, train_seed=0), timeout=timeout)[0]
        same = (new["val_auroc"], new["steps"]) == (old["val_auroc"], old["steps"])
        checks.append({"world": world, "variant": "uncompressed", "train_seed": 0, "same": same,
                       "earlier": [old["val_auroc"], old["steps"]], "here": [new["val_auroc"], new["steps"]]})
        print(f"--baselines-from spot check, world {world}: {checks[-1]}", flush=True)
        if not same:
            dropped += [w for w in worlds if w in reused]
            print(f"--baselines-from: worlds {worlds} ran elsewhere; every arm of them runs here", flush=True)
    metadata["baselines_from"].update(spot_checks=checks, dropped_worlds=sorted(dropped),
                                      worlds=[w for w in metadata["baselines_from"]["worlds"] if w not in dropped])
    return {w: seeds for w, seeds in reused.items() if w not in dropped}

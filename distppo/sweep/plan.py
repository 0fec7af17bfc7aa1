"""`distppo plan`: how long and how much a sweep will take on a cluster, before paying for it.

The trial packing is the sweep's own: trial_bundles() is the placement group `distppo sweep`
requests for each trial and trials_per_node() how many of them one node holds (STRICT_PACK).
Trial minutes come from measured SPS, per game where measured, else the mean of the measured
games: a finished or partial sweep (`--from-sweep`, read as `distppo status` reads it) or a
`distppo bench --json` file (`--from-bench`). Without a measurement: CleanRL's reference minutes
(runtimes.csv) for the algo, labelled so. Makespan: LPT list scheduling (sweep/schedule.py).
Every figure carries the assumption behind it.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass
from typing import Optional

from distppo.config import SweepConfig
from distppo.errors import UserError
from distppo.placement.sizing import fit_sweep, trial_bundles, trials_per_node
from distppo.sweep.schedule import lpt_makespan
from distppo.sweep.status import read_status


@dataclass(frozen=True)
class Cluster:
    nodes: int
    gpus_per_node: float
    cpus_per_node: float
    price_per_node_hour: Optional[float] = None

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise UserError(f"--nodes must be >= 1, got {self.nodes}")
        for key in ("gpus_per_node", "cpus_per_node"):
            if getattr(self, key) < 0:
                raise UserError(f"--{key.replace('_', '-')} must be >= 0, got "
                                f"{getattr(self, key):g}")
        if self.price_per_node_hour is not None and self.price_per_node_hour < 0:
            raise UserError(f"--price-per-node-hour must be >= 0, got {self.price_per_node_hour:g}")


@dataclass(frozen=True)
class Rates:
    """Measured throughput: SPS per (env_id, algo), plus seconds per trial outside training
    (process and env start-up, the first checkpoint copy) that SPS does not see."""
    sps: dict
    overhead_s: float
    source: str


@dataclass
class Figure:
    name: str
    value: Optional[float]
    unit: str
    assumption: str


def rates_from_sweep(uri: str) -> Rates:
    """SPS of every trial of a sweep that has rows (done, running or stopped alike), and the
    seconds a trial costs beyond training: inside the trial (wall-clock minus steps / SPS, of
    its done trials) and, when the sweep ended with --max-concurrent-trials set, between
    trials (Tune's worker start and scheduling: slot time makespan x slots not spent in trials,
    per trial)."""
    status = read_status(uri)
    sps: dict = {}
    inside, walls = [], []
    for t in status.trials:
        if not t.sps_mean:
            continue
        sps.setdefault((t.env_id, t.algo), []).append(t.sps_mean)
        if t.state == "done":  # trial seconds beyond training: only a whole trial shows them
            inside.append(max(t.wall_clock_s - t.global_step / t.sps_mean, 0.0))
            walls.append(t.wall_clock_s)
    if not sps:
        raise UserError(f"--from-sweep {uri}: no trial has measured rows yet")
    between, how = 0.0, "not measured: the sweep is unfinished or set no --max-concurrent-trials"
    if status.state == "finished" and walls and status.concurrency_from == \
            "max_concurrent_trials" and status.makespan_s:
        slots = min(status.concurrency, len(walls))
        between = max(status.makespan_s * slots - sum(walls), 0.0) / len(walls)
        how = f"its makespan x {slots} slots less its trials' wall-clock, per trial"
    n = sum(len(v) for v in sps.values())
    overhead = (statistics.mean(inside) if inside else 0.0) + between
    return Rates({k: statistics.mean(v) for k, v in sps.items()}, overhead,
                 f"sweep {uri} ({n} trial(s) with rows, {len(walls)} done; start-up per trial "
                 f"{overhead - between:,.1f} s in the trial + {between:,.1f} s between trials, "
                 f"{how})")


def rates_from_bench(path: str) -> Rates:
    """Median SPS per algo of a `distppo bench --json` file (its game, all its runs)."""
    try:
        with open(path) as f:
            data = json.load(f)
        runs, env_id = data["runs"], data["env_id"]
        steps = data["total_timesteps"]
        by_algo: dict = {}
        for run in runs:
            by_algo.setdefault((env_id, run["algo"]), []).append(run)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"--from-bench {path}: not a `distppo bench --json` file ({exc})") from None
    if not by_algo:
        raise UserError(f"--from-bench {path}: holds no runs")
    sps = {k: statistics.median(r["sps"] for r in v) for k, v in by_algo.items()}
    overhead = statistics.median(max(r["wall_s"] - steps / r["sps"], 0.0)
                                 for v in by_algo.values() for r in v)
    return Rates(sps, overhead, f"bench {path} ({len(runs)} run(s) of {env_id})")


def trial_minutes(sweep: SweepConfig, rates: Rates) -> tuple[list, str]:
    """([minutes of each grid point], how they were made) from measured SPS."""
    steps = sweep.train.ppo.total_timesteps
    known = list(rates.sps.values())
    mean = statistics.mean(known)
    minutes, guessed = [], 0
    for env_id, algo, _ in sweep.grid():
        sps = rates.sps.get((env_id, algo))
        guessed += sps is None
        minutes.append((rates.overhead_s + steps / (sps or mean)) / 60)
    return minutes, (
        f"measured: {rates.source}; {steps:,} steps / SPS of the same game and algo, else "
        f"the mean of the {len(known)} measured ({mean:,.0f} SPS) for {guessed} of "
        f"{len(minutes)} trials; + {rates.overhead_s:,.1f} s start-up per trial; assumes "
        "the cluster runs a trial as fast as the measured machine")


def _fit(sweep: SweepConfig, cluster: Cluster) -> tuple[SweepConfig, str, list, dict, int]:
    """(the sweep fitted to the cluster, what the fit changed, a trial's bundles, a trial's
    {"CPU", "GPU"}, trials a node holds); one line when no node holds a trial."""
    # the sweep as `distppo sweep` would fit it to this cluster (GPUs resolved, reservations
    # shrunk to a node): the same function, fed the planned nodes instead of ray.nodes()
    planned = [{"Alive": True, "Resources": {"CPU": cluster.cpus_per_node,
                                             "GPU": cluster.gpus_per_node}}] * cluster.nodes
    sweep, fit_said = fit_sweep(sweep, planned, cluster.gpus_per_node * cluster.nodes)
    bundles = trial_bundles(sweep.train, sweep.trial_cpus)
    need = {k: sum(b.get(k, 0.0) for b in bundles) for k in ("CPU", "GPU")}
    node = {"CPU": cluster.cpus_per_node, "GPU": cluster.gpus_per_node}
    per_node = trials_per_node(bundles, node)
    if per_node == 0:
        raise UserError(f"each trial needs {need['CPU']:g} CPU and {need['GPU']:g} GPU on one "
                        f"node but a node has {cluster.cpus_per_node:g} CPU and "
                        f"{cluster.gpus_per_node:g} GPU: the sweep could never start a trial")
    return sweep, fit_said, bundles, need, per_node


def make_plan(sweep: SweepConfig, cluster: Cluster, rates: Optional[Rates],
              reference: Optional[tuple[list, str]] = None) -> dict:
    """The plan; trial minutes from `rates`, or without them from `reference` ([minutes per
    grid point], how they were made: report/references.reference_minutes)."""
    if rates is None and reference is None:
        raise UserError("no measurement and no reference minutes to plan with")
    sweep, fit_said, bundles, need, per_node = _fit(sweep, cluster)
    slots = per_node * cluster.nodes
    capped = bool(sweep.max_concurrent_trials) and sweep.max_concurrent_trials < slots
    slots = sweep.max_concurrent_trials if capped else slots
    minutes, source = trial_minutes(sweep, rates) if rates is not None else reference
    makespan_h = lpt_makespan(minutes, slots) / 60
    node_h = makespan_h * cluster.nodes
    gpu_trial_h = sum(minutes) / 60 * need["GPU"]
    n = len(minutes)
    figures = [
        Figure("trials", n, "trials", f"{len(sweep.games)} games x {len(sweep.algos)} algos x "
               f"{len(sweep.seeds)} seeds, {sweep.train.ppo.total_timesteps:,} steps each"),
        Figure("concurrent trials", slots, "trials",
               f"each trial reserves {need['CPU']:g} CPU + {need['GPU']:g} GPU on one node "
               f"(trial_bundles: {bundles}, STRICT_PACK, as `distppo sweep` requests); a node "
               f"of {cluster.cpus_per_node:g} CPU + {cluster.gpus_per_node:g} GPU holds "
               f"{per_node}; x {cluster.nodes} nodes"
               + (f"; capped by --max-concurrent-trials {slots}" if capped else "")
               + (f"; {fit_said}" if fit_said else "")),
        Figure("per-trial minutes (mean)", statistics.mean(minutes), "min",
               f"min {min(minutes):,.1f}, max {max(minutes):,.1f}; {source}"),
        Figure("makespan", makespan_h, "h",
               f"LPT list scheduling of the {n} trials onto {slots} slots; trials sharing a "
               "node do not slow each other"
               + (" (trials sharing a GPU take turns on it: not yet measured)"
                  if 0 < need["GPU"] < 1 else "")
               + "; no failures or restarts; excludes cluster and Ray start-up"),
        Figure("node-hours", node_h, "node-h",
               f"{cluster.nodes} nodes held for the whole makespan"),
        Figure("GPU-hours", node_h * cluster.gpus_per_node, "GPU-h",
               f"{cluster.gpus_per_node:g} GPU per node held for the whole makespan; the "
               f"trials themselves use {gpu_trial_h:,.1f} GPU-h ({need['GPU']:g} GPU x trial "
               "minutes)"),
    ]
    if cluster.price_per_node_hour is not None:
        figures.append(Figure("cost", node_h * cluster.price_per_node_hour, "$",
                              f"node-hours x ${cluster.price_per_node_hour:g} per node-hour; "
                              "no storage or egress"))
    else:
        figures.append(Figure("cost", None, "$", "no --price-per-node-hour given"))
    return {"experiments": sweep.experiments(), "measured": rates is not None, "slots": slots,
            "trials_per_node": per_node, "trial_minutes": minutes, "makespan_s": makespan_h * 3600,
            "figures": [asdict(f) for f in figures]}


def format_plan(plan: dict) -> str:
    lines = [plan["experiments"]] + ([] if plan["measured"] else [
        "no measurement given (--from-sweep / --from-bench): using CleanRL's reference "
        "runtimes, labelled below"])
    for f in plan["figures"]:
        value = "-" if f["value"] is None else (
            f"{f['value']:,.0f}" if f["unit"] in ("trials",) else f"{f['value']:,.2f}")
        lines.append(f"{f['name'] + ':':26s} {value} {f['unit']}")
        lines.append(f"    {f['assumption']}")
    return "\n".join(lines)

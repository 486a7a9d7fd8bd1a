"""Shared helpers for the planner tests: drive curves, small models and geometries, and an iobench
result written to a rig."""

import json
import os
import shutil
from dataclasses import dataclass

from core.rig import Member, Rig, save_rig
from engine_bridge.harness.arms import ArmSpec, Row, Snapshot, build_results
from iobench.drivemodel import DriveModel
from iobench.result import BenchResult, DriveResult, GroupResult, LaneResult, Latency, PresetResult, save_result
from planner.drivecurves import Drive
from core.drives import DriveInfo
from core.rig import with_model, with_replica

FAST = DriveModel(lat_s=100e-6, stream_bw=150e6, bw_max=200e6)
SLOW = DriveModel(lat_s=100e-6, stream_bw=80e6, bw_max=100e6)
# Same ceiling as SLOW, but one request streams slowly: bulk reads with 8 lanes reach the ceiling,
# three decode pieces in flight do not (a latency- or IOPS-bound enclosure).
LAGGY = DriveModel(lat_s=10e-3, stream_bw=30e6, bw_max=100e6)


def drives3():
    return (Drive("fast", FAST), Drive("slow", SLOW), Drive("laggy", LAGGY))


@dataclass(frozen=True)
class Flat:
    """A drive that moves `bw` bytes/s whatever the read and the queue: k pieces in flight take
    k x size / bw each (Little's law), so a drive's part of a group is its bytes / bw."""
    bw: float

    def throughput(self, size_bytes, in_flight):
        return self.bw

    def request_time(self, size_bytes, in_flight):
        return max(1, in_flight) * size_bytes / self.bw


@dataclass(frozen=True)
class Paced:
    """A drive whose every request takes `lat` + size / `bw` and serves k at once: throughput
    k x size / (lat + size / bw), so a piece of `size` with k in flight costs (lat + size / bw) / k."""
    lat: float
    bw: float

    def throughput(self, size_bytes, in_flight):
        return max(1, in_flight) * size_bytes / (self.lat + size_bytes / self.bw)

    def request_time(self, size_bytes, in_flight):
        return self.lat + size_bytes / self.bw


def write_small_gguf(path, layers=6, experts=32, top_k=4, **kw):
    """A header-only GGUF MoE: V4.1's 6,635,520 B components unless `ne0`/`ne1`/`qtype` say
    otherwise (Q8_0 1024 x 512 gives 557,056 B: 2 blocks of 256 KiB and a 32 KiB tail)."""
    from tests.models.geometry_helpers import write_header_only

    write_header_only(path, layers=layers, experts=experts, top_k=top_k, **kw)
    return path


def write_dir_model(path, model_type, layers=4, experts=16, top_k=4, shards=2, dim=32, ff=16):
    """A safetensors directory MoE (one tensor per expert) whose config.json says `model_type`,
    with the tokenizer.json colibri's launcher asks for. Returns the directory."""
    from tests.models.geometry_helpers import write_moe_safetensors

    d = write_moe_safetensors(path, layers=layers, experts=experts, top_k=top_k, dim=dim, ff=ff, shards=shards,
                              config={"model_type": model_type})
    (d / "tokenizer.json").write_text("{}")
    return d


def make_dir_rig(root, model_dir, names=("fast", "slow"), models=(FAST, SLOW), copies=True):
    """A rig whose model is the safetensors directory `model_dir` (primary), with one replica
    directory per further name (full copies when `copies`, else empty directories), and an iobench
    result with a fitted model per drive."""
    from models.modelset import discover

    os.makedirs(root, exist_ok=True)
    found = discover(str(model_dir))
    rig = with_model(Rig(root=str(root)), found.path, names[0], found.layout, found.format, found.files)
    paths = [found.path]
    for n in names[1:]:
        d = os.path.join(str(root), "mirror-" + n)
        if copies:
            shutil.copytree(found.path, d)
        else:
            os.makedirs(d)
        rig = with_replica(rig, d, n)
        paths.append(d)
    save_rig(rig)
    info = DriveInfo(mount_point="/", fs_type="ext4", device="/dev/x", disk="x", key="disk:x")
    result = BenchResult(created="2026-11-29T19:00:00.000Z",
                         drives=tuple(DriveResult(name=n, path=p, size=1 << 30, cold="o_direct", drive=info, model=m,
                                                  presets={}) for n, p, m in zip(names, paths, models)))
    return rig, save_result(rig, result)


def preset(name, bw, lat=(1000, 1000, 1000, 1000), lanes=3, piece=1 << 20):
    """An iobench PresetResult measured at one lane count: bytes/s `bw`, latency (p50, p95, p99,
    mean) ns."""
    lat_ns = Latency(*lat)
    lane = LaneResult(lanes=lanes, bw_bytes=bw, iops=bw / piece, lat_ns=lat_ns, requests=100)
    return PresetResult(preset=name, piece_bytes=piece, bw_bytes=bw, iops=bw / piece, lat_ns=lat_ns, lanes=(lane,),
                        best_lanes=lanes, knee_lanes=lanes, spread_pct=0.0)


def group(name, preset_name, drives, bw):
    """An iobench GroupResult: `drives` read together moved `bw` bytes/s."""
    return GroupResult(name=name, preset=preset_name, drives=tuple(drives), bw_bytes=bw, members=())


def make_rig(root, names=("fast", "slow", "laggy"), models=(FAST, SLOW, LAGGY), bench_names=None, presets=None,
             groups=(), together=()):
    """A rig.toml naming three files and an iobench result with a fitted model per drive
    (`presets`: per drive, a dict of preset name -> PresetResult; `groups`, `together`: GroupResults)."""
    os.makedirs(root, exist_ok=True)
    paths = [os.path.join(str(root), f"{n}.gguf") for n in names]
    rig = Rig(root=str(root), model=Member(paths[0], names[0], "primary"),
              replicas=tuple(Member(p, n, "replica") for p, n in zip(paths[1:], names[1:])))
    save_rig(rig)
    info = DriveInfo(mount_point="/", fs_type="ext4", device="/dev/x", disk="x", key="disk:x")
    result = BenchResult(created="2026-11-29T19:00:00.000Z",
                         drives=tuple(DriveResult(name=n, path=p, size=1 << 30, cold="o_direct", drive=info, model=m,
                                                  presets=dict(presets[i]) if presets else {})
                                      for i, (n, p, m) in enumerate(zip(bench_names or names, paths, models))),
                         groups=tuple(groups), together=tuple(together))
    return rig, save_result(rig, result)


def write_harness_results(run_dir):
    """A real results.json built by the harness's own build_results: 1drive twice, 3drives once."""
    def res(pre, steady, n):
        return {"prefill_tps": pre, "gen_steady_tps": steady, "gen_tps": steady, "output_sha256": "a" * 64,
                "cache_experts": 64, "cache_experts_applied": 64,
                "sources": [{"index": i, "degraded": False} for i in range(n)]}
    specs = [ArmSpec("1drive", ("/p",), (2,), (5,)), ArmSpec("3drives", ("/p", "/a", "/b"), (2, 1, 1), (5, 3, 2))]
    rows = [Row(i, a, res(*m), "", Snapshot(t=i), Snapshot(t=i + 1))
            for i, (a, m) in enumerate([("1drive", (10.0, 2.0, 1)), ("3drives", (25.0, 3.5, 3)), ("1drive", (12.0, 2.0, 1))])]
    doc = build_results(specs, "ABAB", [r.arm for r in rows], rows, {"cache_experts": 64}, "2026-11-29T19:40:00Z")
    os.makedirs(run_dir)
    with open(os.path.join(run_dir, "results.json"), "w") as f:
        json.dump(doc, f)


SIZE = (120, 40)               # the tuner's terminal in the screen tests


def tuner_rig(root, **kw):
    """make_rig's drives with a small model (a header-only GGUF, 6 layers x 32 experts of V4.1's
    components) as the rig's primary, so the tuner prices the rig's own model."""
    rig, bench = make_rig(root, **kw)
    write_small_gguf(rig.model.path)
    return rig, bench


def tuner_app(root, plan=True, **kw):
    """tuner_rig's drives and model, and a plan with fixed weights and time so the screen is the
    same every run."""
    from planner.plan import Phase, Plan
    from planner.plans import load_inputs, save_plan
    from planner.tui.app import TunerApp  # Textual loads only for the tests that draw
    from planner.tui.load import load_tuner, save_tuned, solve_weights

    rig, _ = tuner_rig(root, **kw)
    if plan:
        inputs = load_inputs(rig.root)
        save_plan(rig, Plan(inputs.sources, Phase((2, 1, 1)), Phase((5, 3, 2)), created="2026-11-29T19:30:00.000Z",
                            provenance=inputs.provenance))
    state = load_tuner(rig.root)
    return TunerApp(state, save=lambda s: save_tuned(rig.root, s), solve=solve_weights, subtitle="rig")


def colibri_tuner_rig(tmp_path):
    """A colibri rig: a GLM-family safetensors directory (4 layers x 16 experts) on three drives
    and a colibri plan with weights 2:1:1 for both phases and O_DIRECT on, created at a fixed time."""
    from planner.plan import Phase, Plan
    from planner.plans import load_inputs, save_plan

    model = write_dir_model(tmp_path / "glm", "glm_moe_dsa")
    rig, _ = make_dir_rig(tmp_path / "rig", model, names=("fast", "slow", "laggy"), models=(FAST, SLOW, LAGGY))
    inputs = load_inputs(rig.root)
    save_plan(rig, Plan(inputs.sources, Phase((2, 1, 1)), Phase((2, 1, 1)), engine="colibri", direct=True,
                        created="2026-11-29T19:30:00.000Z", provenance=inputs.provenance))
    return rig


def colibri_tuner_app(tmp_path, **kw):
    from planner.tui.app import TunerApp
    from planner.tui.load import load_tuner, save_tuned, solve_weights

    rig = colibri_tuner_rig(tmp_path)
    return TunerApp(load_tuner(rig.root), save=lambda s: save_tuned(rig.root, s), solve=solve_weights,
                    subtitle="rig", **kw)


async def no_blink(pilot):
    """Cursor blinking off, so every snapshot of a screen is the same."""
    for w in pilot.app.query("*"):
        if hasattr(w, "cursor_blink"):
            w.cursor_blink = False


# -- small generated models with two copies each, and a rig on them (the measured tuners' tests) --------

NAMES = ("fast", "slow", "laggy")


def _gguf_spec():
    from engine_bridge.moe.synth import SynthSpec

    # 2 layers x 8 experts, top-2: 557,056 B components (2 split blocks + 32 KiB), about 27 MB
    return SynthSpec(2, 8, 2, 512, 1024, 256, 1, "q8_0")


def _coli_spec():
    from engine_bridge.moe.synth_colibri import ColibriSpec

    # 2 layers x 8 experts, top-2, two shards: 32 KiB components whose tensors are not 4 KiB-aligned
    # (so colibri's O_DIRECT windows read more than the expert), about 2 MB
    return ColibriSpec(layers=2, experts=8, top_k=2, dim=128, ff=256, vocab=300, shards=2, seed=3)


GGUF = _gguf_spec()
COLI = _coli_spec()


def gguf_copies_in(d, spec=GGUF):
    """A synthesised GGUF in folder `d` and two byte-identical copies (distinct inodes): their paths, primary first."""
    from engine_bridge.moe.synth import check_spec, synthesize

    paths = [os.path.join(str(d), f"{n}.gguf") for n in NAMES]
    synthesize(paths[0], check_spec(spec), lambda done, total: None)
    for p in paths[1:]:
        shutil.copyfile(paths[0], p)
    return paths


def colibri_copies_in(d, spec=COLI):
    """A synthesised colibri directory in folder `d` and two copies: their paths, primary first."""
    from engine_bridge.moe.synth_colibri import synthesize_colibri

    paths = [os.path.join(str(d), n) for n in NAMES]
    synthesize_colibri(paths[0], spec)
    for p in paths[1:]:
        shutil.copytree(paths[0], p)
    return paths


def rig_on(root, paths):
    """make_rig's three drives (and their iobench result), its members holding the copies at `paths`."""
    from dataclasses import replace

    from models.modelset import discover

    rig, _ = make_rig(str(root))
    m = discover(paths[0])
    rig = replace(rig, model=replace(rig.model, path=paths[0]),
                  replicas=tuple(replace(r, path=p) for r, p in zip(rig.replicas, paths[1:])),
                  layout=m.layout, format=m.format, files=m.files)
    save_rig(rig)
    return rig

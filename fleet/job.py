"""What the asker sends each node: the node's job (pure). Plain data, so it crosses the cluster as is."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from engine_bridge.tunerig.settings import BenchSettings      # the one chain's measurement settings (docs/tune-rig.md)

__all__ = ["BenchSettings", "NodeJob"]


@dataclass(frozen=True)
class NodeJob:
    node: str                       # the fleet's name of the node
    rig: str                        # its rig folder, on the node
    manifest: dict                  # the model every node must hold (a manifest.json document)
    engine: str                     # the plan's and profile's engine
    upstream: dict | None = None    # the model's published digests (an upstream.json document)
    verify: str = "quick"           # replicas verify's mode: quick (a live stamp is trusted) or full
    measure: str = "auto"           # auto: measure only drives the rig's newest iobench result lacks; always
    bench: BenchSettings = BenchSettings()
    cache_experts: int | None = None
    profile: str = ""               # the exported profile's name ('' fleet-NODE)
    force: bool = False             # redo the job even if nothing changed since the last one

    def settings(self) -> dict:
        """What, besides the rig and the model, decides the job's result (part of its rerun key)."""
        d = asdict(self)
        for k in ("node", "rig", "manifest", "force"):
            d.pop(k)
        return d

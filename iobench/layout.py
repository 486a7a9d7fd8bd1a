"""Where the file iobench reads keeps the model's routed experts (the noun; `bench.model_layout`
finds it from the model's header through models.geometry, the one reader of tensor tables)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ExpertLayout:
    component_bytes: int                  # one expert's slice of one expert tensor
    regions: tuple[tuple[int, int], ...]  # [start, end) of each expert tensor's data, bytes
    experts: int                          # experts per tensor

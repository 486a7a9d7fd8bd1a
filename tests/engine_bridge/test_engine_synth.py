import hashlib

import gguf
import numpy as np
import pytest
from typer.testing import CliRunner

from core.errors import UsageError
from engine_bridge.cli import app
from engine_bridge.moe.constants import ALIGNMENT, COMPONENTS, LAYER_RESIDENT
from engine_bridge.moe.inference import dequantize
from engine_bridge.moe.resident import inspect_model
from engine_bridge.moe.synth import SynthSpec, check_spec, synthesize

SMALL = SynthSpec(layers=2, experts=4, top_k=2, dim=256, ff=256, vocab=64, seed=3)


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_same_args_same_bytes_other_seed_other_bytes(tmp_path):
    synthesize(str(tmp_path / "a.gguf"), SMALL)
    synthesize(str(tmp_path / "b.gguf"), SMALL)
    synthesize(str(tmp_path / "c.gguf"), SynthSpec(**{**SMALL.__dict__, "seed": 4}))
    assert sha(tmp_path / "a.gguf") == sha(tmp_path / "b.gguf")
    assert sha(tmp_path / "a.gguf") != sha(tmp_path / "c.gguf")
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []


@pytest.mark.parametrize("quant", ["q8_0", "q4_0", "f32"])
def test_layout_names_alignment_and_expert_major_slices(tmp_path, quant):
    spec = SynthSpec(**{**SMALL.__dict__, "quant": quant})
    path = str(tmp_path / "m.gguf")
    synthesize(path, spec)
    r = gguf.GGUFReader(path)
    assert r.alignment == ALIGNMENT and r.data_offset % ALIGNMENT == 0
    names = {t.name for t in r.tensors}
    for i in range(spec.layers):
        for n in LAYER_RESIDENT:
            assert f"blk.{i}.{n}.weight" in names
        for c in COMPONENTS:
            assert f"blk.{i}.ffn_{c}_exps.weight" in names
    assert {"token_embd.weight", "output_norm.weight", "output.weight"} <= names
    g = inspect_model(path)
    assert (g.layers, g.experts, g.top_k) == (spec.layers, spec.experts, spec.top_k)
    assert g.component_bytes == spec.component_bytes and g.component_bytes % ALIGNMENT == 0
    byname = {t.name: t for t in r.tensors}
    qt = gguf.GGMLQuantizationType[quant.upper()]
    data = lambda t, e: np.asarray(t.data[e])  # noqa: E731
    with open(path, "rb") as f:
        for layer in range(spec.layers):
            for e in range(spec.experts):
                for c, (off, n) in zip(COMPONENTS, ((x.offset, x.length) for x in g.expert_ranges(layer, e))):
                    assert off % ALIGNMENT == 0 and n % ALIGNMENT == 0
                    t = byname[f"blk.{layer}.ffn_{c}_exps.weight"]
                    assert t.tensor_type == qt
                    f.seek(off)
                    raw = f.read(n)
                    # expert e of the tensor is exactly the slice at tensor_offset + e * component_bytes
                    assert raw == data(t, e).tobytes()
                    rows, cols = (spec.dim, spec.ff) if c == "down" else (spec.ff, spec.dim)
                    ours = dequantize(raw, quant.upper(), rows, cols)
                    assert np.array_equal(ours, gguf.quants.dequantize(data(t, e), qt).reshape(rows, cols))


@pytest.mark.parametrize("kw, words", [
    (dict(dim=256, ff=128), "multiple of 65536"),
    (dict(dim=100), "multiple of 32"),
    (dict(top_k=5), "--top-k 5"),
    (dict(quant="q5_k"), "--quant"),
    (dict(layers=0), "--layers"),
])
def test_shapes_the_layout_cannot_hold_are_refused(kw, words):
    with pytest.raises(UsageError, match=words.replace("-", r"\-")):
        check_spec(SynthSpec(**{**SMALL.__dict__, **kw}))


def test_cli_synth_json_and_refusal(tmp_path):
    runner = CliRunner()
    out = tmp_path / "m.gguf"
    r = runner.invoke(app, ["synth", str(out), "--layers", "1", "--experts", "2", "--top-k", "1", "--dim", "256",
                            "--ff", "256", "--vocab", "32", "--json"])
    assert r.exit_code == 0, r.output
    assert '"component_bytes": 69632' in r.stdout and out.exists()
    r = runner.invoke(app, ["synth", str(tmp_path / "x.gguf"), "--dim", "256", "--ff", "96"])
    assert r.exit_code == 2 and "65536" in r.output
    assert not (tmp_path / "x.gguf").exists()


def test_cli_synth_never_overwrites_unasked(tmp_path):
    """A typo in OUT must not replace a model or a replica: an existing path is refused (exit 2,
    untouched) unless --force, which replaces a file; a folder is never replaced by a GGUF file."""
    runner = CliRunner()
    small = ["--layers", "1", "--experts", "2", "--top-k", "1", "--dim", "256", "--ff", "256", "--vocab", "32"]
    victim = tmp_path / "model.gguf"
    victim.write_bytes(b"a model someone cares about")
    r = runner.invoke(app, ["synth", str(victim), *small])
    assert r.exit_code == 2 and "already exists" in r.output and "--force" in r.output
    assert victim.read_bytes() == b"a model someone cares about"
    r = runner.invoke(app, ["synth", str(victim), *small, "--force"])
    assert r.exit_code == 0, r.output
    assert victim.read_bytes()[:4] == b"GGUF"
    r = runner.invoke(app, ["synth", str(tmp_path), *small, "--force"])
    assert r.exit_code == 2 and "is a folder" in r.output

"""Plain helpers writing MoE models whose tensor tables the geometry tests read
(imported as `tests.models.geometry_helpers`).

tests.helpers.write_split_gguf / write_safetensors_dir write real multi-file models with generic
tensor names; these write the routed-expert names and shapes real MoE models use.
"""

import json
import os
import pathlib

import gguf
import numpy as np

# DeepSeek V4.1 Flash Q4 (docs/planner.md): Q4_K slices of 4096 x 2880 values = 4096 * 2880 / 256 * 144 B.
V41_COMPONENT = 6_635_520
V41_NE0, V41_NE1, V41_EXPERTS, V41_LAYERS, V41_TOP_K = 4096, 2880, 384, 40, 6


def write_header_only(path, layers=V41_LAYERS, experts=V41_EXPERTS, arch="deepseek2", top_k=6, names=None,
                      shared=None, ne0=V41_NE0, ne1=V41_NE1, qtype="Q4_K"):
    """A GGUF whose tensor table describes the real V4.1 geometry (stacked Q4_K experts of
    V41_COMPONENT bytes each; other `ne0` x `ne1` slices of `qtype` for other models); the data
    region is a hole (the header is written, then the file is truncated up to where the data would
    end: a sparse file). `shared`: also list one merged shared expert per layer and record
    expert_shared_count. Returns the file's size in bytes."""
    w = gguf.GGUFWriter(str(path), arch)
    if top_k is not None:
        w.add_uint32(f"{arch}.expert_used_count", top_k)
    if shared is not None:
        w.add_uint32(f"{arch}.expert_shared_count", shared)
    qt = gguf.GGMLQuantizationType[qtype]
    values, nbytes = gguf.GGML_QUANT_SIZES[qt]
    row = ne0 // values * nbytes
    names = names or [f"blk.{layer}.ffn_{c}_exps.weight" for layer in range(layers) for c in ("gate", "up", "down")]
    tensors = [(n, (experts, ne1, row)) for n in names]
    if shared is not None:
        tensors += [(f"blk.{layer}.ffn_{c}_shexp.weight", (ne1 * shared, row)) for layer in range(layers)
                    for c in ("gate", "up", "down")]
    total = 0
    for n, shape in tensors:
        nbytes = int(np.prod(shape))
        w.add_tensor_info(n, shape, np.dtype(np.uint8), nbytes, raw_dtype=qt)
        total += w.ggml_pad(nbytes, w.data_alignment)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    start = w.ggml_pad(w.fout[0].tell(), w.data_alignment)
    w.close()
    os.truncate(path, start + total)
    return start + total


def write_moe_split_gguf(dir, prefix, layers=3, experts=4, top_k=2, dim=64, ff=32, per_part=4, arch="qwen3moe",
                         seed=0):
    """A real split GGUF set of a small MoE (F16 stacked experts, plus a router per layer) written
    by the gguf library with `per_part` tensors per file; down is F32 while gate/up are F16, so
    components differ in size. Returns the member paths in set order."""
    dir = pathlib.Path(dir)
    dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(dir / f"{prefix}.gguf"), arch, split_max_tensors=per_part)
    w.add_uint32(f"{arch}.expert_used_count", top_k)
    w.add_uint32(f"{arch}.expert_count", experts)
    for layer in range(layers):
        w.add_tensor(f"blk.{layer}.ffn_gate_inp.weight", rng.standard_normal((experts, dim), dtype=np.float32))
        for c in ("gate", "up", "down"):
            shape = (experts, dim, ff) if c == "down" else (experts, ff, dim)
            a = rng.standard_normal(shape, dtype=np.float32)
            w.add_tensor(f"blk.{layer}.ffn_{c}_exps.weight", a if c == "down" else a.astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    paths = sorted(dir.glob(f"{prefix}-*-of-*.gguf"))
    assert len(paths) > 1, "the gguf library did not split the set"
    return paths


MIXTRAL = "model.layers.{l}.block_sparse_moe.experts.{e}.{c}.weight", {"gate": "w1", "up": "w3", "down": "w2"}
QWEN3 = "model.layers.{l}.mlp.experts.{e}.{c}.weight", {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}


def write_moe_safetensors(dir, naming=QWEN3, layers=2, experts=4, top_k=2, dim=32, ff=16, shards=2, first_dense=0,
                          config=None, seed=0):
    """A Hugging Face checkpoint directory of a small MoE with one tensor per expert (`naming`:
    MIXTRAL or QWEN3 names), written by safetensors' numpy API across `shards` shards with
    model.safetensors.index.json and config.json. Layers below `first_dense` are dense (a plain
    mlp, as DeepSeek V3's first layers); down_proj is float32 and gate/up float16. Returns the
    directory."""
    from safetensors.numpy import save_file

    dir = pathlib.Path(dir)
    dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    pattern, comp = naming
    tensors = {"model.embed_tokens.weight": rng.standard_normal((8, dim), dtype=np.float32)}
    for layer in range(layers):
        tensors[f"model.layers.{layer}.input_layernorm.weight"] = np.ones(dim, np.float32)
        if layer < first_dense:
            for c in ("gate_proj", "up_proj", "down_proj"):
                tensors[f"model.layers.{layer}.mlp.{c}.weight"] = rng.standard_normal((ff, dim), dtype=np.float32)
            continue
        tensors[f"model.layers.{layer}.mlp.gate.weight"] = rng.standard_normal((experts, dim), dtype=np.float32)
        for e in range(experts):
            for c in ("gate", "up", "down"):
                shape = (dim, ff) if c == "down" else (ff, dim)
                a = rng.standard_normal(shape, dtype=np.float32)
                tensors[pattern.format(l=layer, e=e, c=comp[c])] = a if c == "down" else a.astype(np.float16)
    names = list(tensors)
    weight_map = {}
    for s in range(shards):
        shard = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s::shards]}
        save_file(part, str(dir / shard), metadata={"format": "pt"})
        weight_map.update({n: shard for n in part})
    (dir / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    cfg = {"model_type": "qwen3_moe" if naming is QWEN3 else "mixtral", "num_hidden_layers": layers,
           "num_experts_per_tok": top_k, "num_local_experts" if naming is MIXTRAL else "num_experts": experts}
    (dir / "config.json").write_text(json.dumps({**cfg, **(config or {})}))
    return dir

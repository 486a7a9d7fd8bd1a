"""Helpers for the iobench tests: a small MoE GGUF written with the gguf library."""

import numpy as np


def write_moe_gguf(path, layers=2, experts=4, rows=8, cols=256):
    import gguf

    w = gguf.GGUFWriter(str(path), "deepseek2")
    w.add_block_count(layers)
    w.add_expert_count(experts)
    w.add_expert_used_count(2)
    w.add_tensor("token_embd.weight", np.zeros((16, cols), dtype=np.float32))
    for b in range(layers):
        for kind in ("gate", "up", "down"):
            w.add_tensor(f"blk.{b}.ffn_{kind}_exps.weight", np.ones((experts, rows, cols), dtype=np.float32))
        w.add_tensor(f"blk.{b}.attn_norm.weight", np.ones(cols, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return rows * cols * 4          # bytes per expert component (F32)

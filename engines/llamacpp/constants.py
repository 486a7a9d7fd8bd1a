"""llama.cpp's facts: its name, how it opens a model, its load modes, arguments and log lines (pure).

Read from llama.cpp's source as the registry's `llama-cpp-python` 0.3.36 source distribution
carries it (vendor/llama.cpp, llama.cpp commit 0c1e570); docs/engine-profiles.md, "llama.cpp",
names every function and what was checked with the built binary.
"""

from __future__ import annotations

NAME = "llama.cpp"

# Sources: llama.cpp itself has no notion of replicas. It opens the first split it is given and
# derives the others by name from that path as given, never resolved (src/llama.cpp
# `llama_split_path`, SPLIT_PATH_FORMAT "%s-%05d-of-%05d.gguf"; src/llama-model-loader.cpp
# `llama_get_list_splits`), so a folder of symbolic links, one per split file, each to the copy
# on the drive chosen for it, is a model it loads. The cap is ours: the weight grid the solver
# searches grows as WEIGHT_MAX ** sources.
MAX_SOURCES = 4
WEIGHT_MIN, WEIGHT_MAX = 1, 8          # a source's share of the split files' bytes (ours: the links)
PAGE = 4096                            # bytes: the unit an mmap fault reads at least
PATH_FORBIDDEN = "\n"                  # paths go into symbolic links and one -m argument: no list separator
SPLIT_FORMAT = "%s-%05d-of-%05d.gguf"  # src/llama.cpp SPLIT_PATH_FORMAT (1-based number, count)

# Decode and prefill with mmap: a weight page not in the page cache is faulted in by the compute
# thread that touches it (ggml/src/ggml-cpu/ggml-cpu.c `ggml_compute_forward_mul_mat_id`: only
# the selected experts' slices, ascending expert index). Each MUL_MAT_ID op reads one expert
# tensor, and a tensor never spans files (src/llama-model-loader.h `llama_tensor_weight`), so
# while an op runs every fault goes to one file, on one drive; the graph's ops run one after
# another (build_moe_ffn in src/llama-graph.cpp: up, then gate, then down). FAULTS_IN_FLIGHT is
# the faults one thread has outstanding (measured with -t 1; with more threads a tensor's rows
# are shared out, still within the same file and drive).
FAULTS_IN_FLIGHT = 1
COMPONENT_ORDER = ("up", "gate", "down")    # the order build_moe_ffn issues the expert matmuls
# The kernel's read around a fault: 2 x the device's read_ahead_kb after POSIX_FADV_SEQUENTIAL
# (src/llama-mmap.cpp `llama_mmap::impl`). 128 KiB is the usual NVMe default; the device's own
# value is the device's fact (the testbed sets and reports it).
DEFAULT_READ_AHEAD = 128 * 1024
FAULT_READ = 2 * DEFAULT_READ_AHEAD

# ---------------------------------------------------------------------------------------------
# Load modes: common/arg.cpp `-lm/--load-mode auto|none|mmap|mlock|mmap+mlock|dio` (env
# LLAMA_ARG_LOAD_MODE); src/llama-model-loader.cpp `llama_model_loader` sets use_mmap for
# auto/mmap/mmap+mlock and use_direct_io for dio. Our switches name the ones a plan can ask for.

ARG_MODEL, ARG_MODEL_LONG = "-m", "--model"
ARG_LOAD_MODE, ARG_LOAD_MODE_LONG = "-lm", "--load-mode"
ARG_NO_REPACK = "--no-repack"          # common/arg.cpp {"--repack"}, {"-nr", "--no-repack"}
PROFILE_ARGS = frozenset({ARG_MODEL, ARG_MODEL_LONG, ARG_LOAD_MODE, ARG_LOAD_MODE_LONG, ARG_NO_REPACK, "-nr",
                          "--repack"})
LOAD_MMAP = "mmap"
# switch name -> the -lm value it gives
NO_MMAP, MLOCK, DIO, NO_REPACK = "no-mmap", "mlock", "dio", "no-repack"
LOAD_MODES = {NO_MMAP: "none", MLOCK: "mmap+mlock", DIO: "dio"}
# Load modes that keep every weight in RAM after load (anonymous buffers, or a locked mapping):
# a step reads nothing from the drives, and a model larger than RAM cannot load (measured:
# OOM-killed under a memory cgroup smaller than the model with -lm none and -lm dio).
RESIDENT = frozenset(LOAD_MODES)

# Environment: the common tools read each argument from a variable when it is not given
# (common/arg.cpp `.set_env`). The profile gives arguments; these are unset so a stale one in
# the shell cannot stand in for an argument the profile leaves out.
ENV_PREFIX = "LLAMA_ARG_"
ENV_KEYS = ("LLAMA_ARG_MODEL", "LLAMA_ARG_LOAD_MODE", "LLAMA_ARG_REPACK")
# Launch asks for the loader's lines (printed at verbosity 4: llama-completion's default hides them).
ENV_VERBOSITY = "LLAMA_ARG_LOG_VERBOSITY"
REPORT_VERBOSITY = "4"

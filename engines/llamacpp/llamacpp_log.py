"""The lines in which llama.cpp says what it loaded and how fast it ran (pure; docs/engine-profiles.md).

- src/llama-model-loader.cpp `llama_model_loader::llama_model_loader`: "additional %d GGUFs
  metadata loaded." (split sets only) and "loaded meta data with %d key-value pairs and %d tensors
  from %s (version %s)", the path as it was given;
- src/llama-model.cpp `load_tensors`: "loading model tensors, this can take a while...
  (load_mode = %s)" and one "%s model buffer size = %8.2f MiB" per buffer: CPU_Mapped is a file's
  mapping, CPU_REPACK an anonymous repacked copy (x86 with AVX2: Q4_0, Q4_K, ...), CPU a
  buffer the weights were read into;
- src/llama-model-loader.cpp `llama_file::impl`: "Failed to open file '%s' with error: %s. Falling
  back to buffered I/O" when dio cannot open a file with O_DIRECT;
- timing: llama-completion's `common_perf_print` and llama-simple's `llama_perf_context_print`
  (src/llama-context.cpp): "prompt eval time = %10.2f ms / %5d tokens (... %8.2f tokens per
  second)" and "eval time = %10.2f ms / %5d runs (... %8.2f tokens per second)".
The loader's lines are printed at log verbosity 4 (llama-completion hides them by default; launch
sets LLAMA_ARG_LOG_VERBOSITY). Each line may carry the common log's time and level prefix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..handoff import last_match

LOG_ADDITIONAL = re.compile(r"llama_model_loader: additional (\d+) GGUFs metadata loaded\.")
LOG_LOADED = re.compile(r"llama_model_loader: loaded meta data with (\d+) key-value pairs and (\d+) tensors from (.+?) "
                        r"\(version ")
LOG_LOAD_MODE = re.compile(r"load_tensors: loading model tensors, this can take a while\.\.\. \(load_mode = ([^)]+)\)")
LOG_BUFFER = re.compile(r"load_tensors:\s+(\S+) model buffer size =\s+([\d.]+) MiB")
LOG_DIO_FALLBACK = re.compile(r"Falling back to buffered (?:I/O|IO)")
LOG_PROMPT = re.compile(r"(?:common_perf_print|llama_perf_context_print): prompt eval time =\s+([\d.]+) ms /\s+(\d+) "
                        r"tokens \(.*?([\d.]+) tokens per second\)")
LOG_EVAL = re.compile(r"(?:common_perf_print|llama_perf_context_print):\s+eval time =\s+([\d.]+) ms /\s+(\d+) runs\s+"
                      r"\(.*?([\d.]+) tokens per second\)")
LINES = (LOG_ADDITIONAL, LOG_LOADED, LOG_LOAD_MODE, LOG_BUFFER, LOG_DIO_FALLBACK, LOG_PROMPT, LOG_EVAL)


@dataclass(frozen=True)
class LoaderLog:
    """What one run's log says it loaded and how fast it ran (None / 0 where it says nothing)."""
    model: str | None = None            # the path it loaded, as given
    tensors: int | None = None
    additional: int | None = None       # split files besides the first (None: one file, or not printed)
    load_mode: str | None = None
    buffers: tuple[tuple[str, float], ...] = ()   # (buffer type, MiB), in order
    dio_fallback: bool = False
    prompt: tuple[float, int, float] | None = None    # (ms, tokens, tok/s)
    eval: tuple[float, int, float] | None = None      # (ms, runs, tok/s)
    eval_speed_text: str = ""                         # the decode speed as printed

    def count(self, kind: str) -> int:
        return sum(1 for k, _ in self.buffers if k == kind)


def read_log(text: str) -> LoaderLog:
    loaded = last_match(LOG_LOADED, text)
    add = last_match(LOG_ADDITIONAL, text)
    mode = last_match(LOG_LOAD_MODE, text)
    prompt = last_match(LOG_PROMPT, text)
    ev = last_match(LOG_EVAL, text)
    # the loader runs twice when the tools first fit the parameters to memory (common_fit_params):
    # the buffers of the last load are the ones the run used
    blocks = text.split("load_tensors: loading model tensors")
    last = blocks[-1] if len(blocks) > 1 else ""
    return LoaderLog(model=loaded[2] if loaded else None, tensors=int(loaded[1]) if loaded else None,
                     additional=int(add) if add is not None else None, load_mode=mode.strip() if mode else None,
                     buffers=tuple((k, float(v)) for k, v in LOG_BUFFER.findall(last)),
                     dio_fallback=bool(LOG_DIO_FALLBACK.search(text)),
                     prompt=(float(prompt[0]), int(prompt[1]), float(prompt[2])) if prompt else None,
                     eval=(float(ev[0]), int(ev[1]), float(ev[2])) if ev else None,
                     eval_speed_text=ev[2] if ev else "")


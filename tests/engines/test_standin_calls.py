"""How each engine's profile reads a call for its stand-in (`standin_call`, pure): the variables and
arguments as the engine reads them, with the facts of the paths given here."""

from engines.colibri import colibri_profile, colibri_standin
from engines.ds4_argodrive import ds4_profile as ds4_argodrive_profile

SHARDS = {"out-00000.safetensors": (100, b"h0"), "out-00001.safetensors": (200, b"h1")}
DIRS = {"/m": {"model_type": "glm_moe_dsa", "layers": 4, "shards": SHARDS},
        "/g": {"model_type": "glm_moe_dsa", "layers": 4, "shards": SHARDS},
        "/w": {"model_type": "glm_moe_dsa", "layers": 4, "shards": {**SHARDS, "out-00001.safetensors": (200, b"xx")}},
        "/e": {"model_type": "glm_moe_dsa", "layers": 4, "shards": {}}}


def coli(env, argv=("2",)):
    return colibri_profile.standin_call({"SNAP": "/m", "REF": "/ref.json", **env}, list(argv), lambda p: DIRS.get(p, {}))


def test_colibri_admits_mirrors_by_size_and_header_and_takes_or_rejects_the_weights():
    c = coli({"COLI_MODEL_MIRROR": "/g;/w;/e", "COLI_DISK_WEIGHTS": "2,1,1", "DIRECT": "1"})
    assert c.sources == ("/m", "/g", "/w") and c.weights == (2, 1, 1) and c.switches == frozenset({"direct", "stripe"})
    assert c.cache_experts == 8 and c.reference == "/ref.json" and c.full_key == "full_ids"
    assert "[MIRROR] /w: 1/2 shards (replica 2)" in c.stderr
    assert "[MIRROR] /w/out-00001.safetensors: header differs from the primary copy \u2014 skipped" in c.stderr
    assert "[MIRROR] /e: no usable shard (missing or divergent copy) \u2014 ignored" in c.stderr
    probe = coli({"COLI_MODEL_MIRROR": "/g", "COLI_DISK_WEIGHTS": "2,1,1"})
    assert probe.weights is None and any("invalid COLI_DISK_WEIGHTS '2,1,1' (want 2" in x for x in probe.stderr)
    assert coli({"COLI_MODEL_MIRROR": "/g", "DIRECT": "1", "COLI_MIR_STRIPE": "0"}).switches == frozenset({"direct"})
    assert coli({}, ()).cache_per_layer == colibri_standin.DEFAULT_CACHE_PER_LAYER


def test_colibri_refuses_what_the_engine_refuses():
    assert coli({"SNAP": ""}).rc == 2
    assert "REF=<json>" in colibri_profile.standin_call({"SNAP": "/m"}, ["2"], lambda p: DIRS.get(p, {})).error
    v41 = {"/m": {**DIRS["/m"], "model_type": "deepseek_v41"}}
    c = colibri_profile.standin_call({"SNAP": "/m"}, ["2", "/r.json"], lambda p: v41.get(p, {}))
    assert c.variant == "deepseek_v41" and (c.reference, c.expected_key) == ("/r.json", "output_ids")


FILES = {"/m.gguf": {"size": 10, "dev": 1, "ino": 1}, "/g.gguf": {"size": 10, "dev": 2, "ino": 1},
         "/w.gguf": {"size": 11, "dev": 3, "ino": 1}}


def ds4(env, argv=("--ssd-streaming", "-m", "/m.gguf", "--ssd-streaming-cache-experts", "8")):
    return ds4_argodrive_profile.standin_call(env, list(argv), lambda p: FILES.get(p, {}))


def test_ds4_reads_its_split_keys_and_rejects_a_configuration_its_reader_rejects():
    c = ds4({"DS4_ARGODRIVE_PRIMARY_WEIGHT": "10", "DS4_ARGODRIVE_REPLICAS": "/g.gguf*5",
             "DS4_ARGODRIVE_DECODE_WEIGHTS": "3,2"})
    assert c.sources == ("/m.gguf", "/g.gguf") and c.weights == (10, 5) and c.decode_weights == (3, 2)
    assert "ds4: experimental Argodrive expert reader sources=2; Engram unchanged" in c.stderr
    assert c.cache_experts == 8
    bad = ds4({"DS4_ARGODRIVE_PRIMARY_WEIGHT": "10", "DS4_ARGODRIVE_REPLICAS": "/w.gguf*5"})   # another size
    assert bad.sources == ("/m.gguf",) and "ds4: Argodrive source[1] bytes=0" in bad.stderr
    ignored = ds4({"DS4_ARGODRIVE_PRIMARY_WEIGHT": "10", "DS4_ARGODRIVE_REPLICAS": "/g.gguf*5",
                   "DS4_ARGODRIVE_DECODE_WEIGHTS": "3"})
    assert ignored.decode_weights is None and any(x.startswith("ds4: ignoring DS4_ARGODRIVE_DECODE") for x in ignored.stderr)
    assert ds4({}, ("-m", "/nope")).rc == 1

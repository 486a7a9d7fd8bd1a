"""Engine profiles (engines.handoff and each engine's profile module, pure): every engine with a
profile answers every question export and launch ask; the environment and arguments a plan gives
each engine; the rules that refuse bad input, each violation one line; which models each engine
reads; which directory colibri loads for a plan source and which member of its family runs it."""

import inspect

import pytest

from engines import colibri, ds4_argodrive
from engines.colibri import colibri_profile
from engines.colibri import constants as coli
from engines.colibri.colibri_reads import reads_model as colibri_reads_model
from engines.ds4_argodrive import constants as ds4
from engines.ds4_argodrive import ds4_profile as ds4_argodrive_profile
from engines.ds4_argodrive.ds4_reads import reads_model as ds4_reads_model
from engines.handoff import EngineProfile, Request, Setting, SourceFacts, SourceView
from engines.registry import ENGINES
from tests.helpers import impure_imports

MEMBERS = [n for n, _ in inspect.getmembers(EngineProfile) if not n.startswith("_")] + \
    list(EngineProfile.__annotations__)


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_every_engine_answers_every_question_export_and_launch_ask(name):
    prof = ENGINES[name].profile
    assert prof is not None
    missing = [m for m in MEMBERS if not hasattr(prof, m)]
    assert missing == []
    assert prof.checks[0] == "exit" and set(prof.plan_keys()) <= set(prof.managed_keys())
    assert isinstance(prof.report_env(), dict) and ENGINES[name].reads_model is not None


@pytest.mark.parametrize("module", [ds4_argodrive_profile, colibri_profile, __import__("engines.handoff").handoff])
def test_profile_modules_are_pure(module):
    assert impure_imports(module) == []


def test_the_engines_profiles_are_their_own_modules():
    assert ds4_argodrive.ENGINE.profile is ds4_argodrive_profile and colibri.ENGINE.profile is colibri_profile


# ---------------------------------------------------------------------------------------------
# The profile a plan gives

def test_ds4_three_sources_named_keys_after_the_plans():
    r = Request(paths=("/i/m.gguf", "/g/m.gguf", "/w/m.gguf"), prefill=(10, 5, 5), decode=(10, 6, 6),
                cache_experts=4600, named=(("DS4_ARGODRIVE_PREFILL_LANES", "8"), ("DS4_ARGODRIVE_REPLICAS", "/x*1")))
    s = ds4_argodrive_profile.setting(r)
    assert s == Setting((("DS4_ARGODRIVE_PRIMARY_WEIGHT", "10"), ("DS4_ARGODRIVE_REPLICAS", "/g/m.gguf*5,/w/m.gguf*5"),
                         ("DS4_ARGODRIVE_DECODE_WEIGHTS", "10,6,6"), ("DS4_ARGODRIVE_PREFILL_LANES", "8")),
                        ("--ssd-streaming", "-m", "/i/m.gguf", "--ssd-streaming-cache-experts", "4600"))
    assert ds4_argodrive_profile.header(r, s) == (
        "engine arguments: --ssd-streaming -m /i/m.gguf --ssd-streaming-cache-experts 4600",
        "weights: prefill (base) 10:5:5, decode 10:6:6; expert cache 4600 experts")
    one = Request(paths=("/i/m.gguf",), prefill=(1,), decode=(1,), cache_experts=10)
    assert ds4_argodrive_profile.setting(one).environment == ()
    assert "(single source: no split)" in ds4_argodrive_profile.header(one, ds4_argodrive_profile.setting(one))[1]


def test_ds4_manages_its_split_keys_its_knobs_and_the_named_profiles_keys():
    keys = ds4_argodrive_profile.managed_keys(["DS4_NEW", "DS4_ARGODRIVE_PREFILL_LANES"])
    assert keys[:3] == ds4.SPLIT_KEYS and keys[-1] == "DS4_NEW" and len(keys) == len(set(keys))
    assert set(ds4.PRESENCE_FLAGS) <= set(keys)
    assert ds4_argodrive_profile.clear_prefix() == "DS4_" and ds4_argodrive_profile.named_profiles


def test_colibri_one_weight_vector_directories_and_stripe():
    r = Request(paths=("/i/glm", "/g/glm", "/w/glm"), prefill=(9, 3, 3), decode=(10, 6, 6),
                switches=frozenset({"direct", "stripe"}), variant="glm")
    s = colibri_profile.setting(r)
    assert s == Setting((("COLI_MODEL", "/i/glm"), ("SNAP", "/i/glm"), ("COLI_MODEL_MIRROR", "/g/glm;/w/glm"),
                         ("COLI_DISK_WEIGHTS", "9,3,3"), ("DIRECT", "1"), ("COLI_MIR_STRIPE", "1")), ())
    assert colibri_profile.managed_keys(["DS4_X"]) == coli.ENV_KEYS     # named profiles do not apply
    header = colibri_profile.header(r, s)
    assert "COLI_DISK_WEIGHTS are the plan's base weights 9:3:3" in header[1]
    assert header[2] == "engine: colibri's glm (c/colibri.c), which its launcher runs for this model's config.json model_type"
    assert header[3].startswith("striping: DIRECT=1")
    assert colibri_profile.setting(Request(paths=("/i/glm",), prefill=(1,), decode=(1,))).environment == (
        ("COLI_MODEL", "/i/glm"), ("SNAP", "/i/glm"))
    assert colibri_profile.given_by((), dict(s.environment)) == "COLI_MODEL=/i/glm"


# ---------------------------------------------------------------------------------------------
# The rules

def dir_facts(n=3, model_type="glm_moe_dsa", config="ok"):
    shards = (("model-00001-of-00001.safetensors", 100),)
    out = [SourceFacts(0, "/i/glm", regular=False, device=1, inode=1, directory="/i/glm", shards=shards, tokenizer=True,
                       config=config, model_type=model_type)]
    out += [SourceFacts(i, f"/d{i}/glm", regular=False, device=1, inode=10 + i, state="verified", directory=f"/d{i}/glm",
                        shards=shards) for i in range(1, n)]
    return out


def request(n=3, w=(9, 3, 3), switches=frozenset()):
    return Request(paths=tuple(f"/d{i}" for i in range(n)), prefill=w[:n], decode=w[:n], switches=frozenset(switches))


def test_colibri_takes_a_good_directory_plan_and_names_the_member():
    assert colibri_profile.check(dir_facts(), request()) == []
    assert colibri_profile.variant(dir_facts()) == "glm"
    assert colibri_profile.variant(dir_facts(model_type="glm5_next")) == "glm53"
    assert colibri_profile.variant(dir_facts(model_type="DeepSeek_V41_Text ")) == "deepseek_v41"
    assert colibri_profile.variant([SourceFacts(0, "/x", exists=False)]) == ""


def test_glm53_takes_integer_weights_only():
    v = colibri_profile.check(dir_facts(model_type="glm5_next"), request(w=(9.5, 3, 3)))
    rules = [x.rule for x in v]
    assert "integer-weights" in rules
    line = str(next(x for x in v if x.rule == "integer-weights"))
    assert line == ("prefill.weights: colibri's glm53 engine (c/glm53.c) reads COLI_DISK_WEIGHTS with strtol: "
                    "integers only, not 9.5")
    # the GLM engine reads atof: the member rule does not apply (our plans still hold integers 1..100)
    assert "integer-weights" not in [x.rule for x in colibri_profile.check(dir_facts(), request(w=(9.5, 3, 3)))]


def test_only_the_glm_engine_stripes():
    assert colibri_profile.check(dir_facts(), request(switches={"direct", "stripe"})) == []
    v = colibri_profile.check(dir_facts(model_type="deepseek_v4"), request(switches={"direct", "stripe"}))
    assert [x.rule for x in v] == ["stripe"]
    assert "colibri's deepseek_v4 engine (c/deepseek_v4.c, model_type 'deepseek_v4') never stripes" in str(v[0])


@pytest.mark.parametrize("model_type, config, needle", [
    ("inkling", "ok", "runs colibri's inkling engine, whose mirror rules replica-tuner does not reproduce"),
    ("llama", "ok", "colibri has no engine for model_type 'llama' (unsupported model_type)"),
    (None, "ok", "config.json has no model_type"),
    (None, "", "model directory /i/glm has no config.json; colibri's launcher picks its engine by its model_type"),
    (None, "is not a JSON object", "/i/glm/config.json is not a JSON object"),
])
def test_a_model_colibri_has_no_engine_for_is_refused_in_one_line(model_type, config, needle):
    v = colibri_profile.check(dir_facts(model_type=model_type, config=config), request())
    assert [x.rule for x in v] == ["model-type"]
    assert needle in str(v[0]) and "\n" not in str(v[0])


def test_ds4_rules_each_one_line():
    facts = [SourceFacts(0, "/a/m.gguf", size=10, device=1, inode=1),
             SourceFacts(1, "/b,c/m.gguf", size=11, device=1, inode=1, state="stale")]
    v = ds4_argodrive_profile.check(facts, Request(paths=("/a", "/b"), prefill=(10, 0), decode=(10,)))
    assert [x.rule for x in v] == ["bad-character", "weight-range", "weight-count", "size", "same-inode", "unverified"]
    assert all("\n" not in str(x) for x in v)
    assert str(v[1]) == "prefill.weights[1]: weight 0 is not an integer 1..100"


# ---------------------------------------------------------------------------------------------
# Which directory colibri loads, which models each engine reads

def test_a_single_shard_stands_for_its_folder_only_when_colibri_would_load_just_that():
    one = [("model.safetensors", 10), ("tokenizer.json", 2)]
    assert colibri_profile.source_view("/a/model.safetensors", False, one) == \
        SourceView("/a", "", (("model.safetensors", 10),), True)
    v = colibri_profile.source_view("/b/other.safetensors", False, [("other.safetensors", 10)], "model.safetensors")
    assert v.directory == "" and "is not named model.safetensors like the model" in v.not_loadable
    v = colibri_profile.source_view("/a/model.safetensors", False, one + [("extra.safetensors", 1)])
    assert v.directory == ""
    assert "colibri would load every shard in /a" in v.not_loadable and "extra.safetensors" in v.not_loadable
    v = colibri_profile.source_view("/a/model.gguf", False, [("model.gguf", 10)])
    assert "is not a directory of safetensors shards, which is all colibri loads" in v.not_loadable
    d = colibri_profile.source_view("/m", True, [("config.json", 3), ("b.safetensors", 2), ("a.safetensors", 1)])
    assert d == SourceView("/m", "", (("a.safetensors", 1), ("b.safetensors", 2)), False)


@pytest.mark.parametrize("fmt, layout, files, ds4_ok, colibri_needle", [
    ("gguf", "file", ("m.gguf",), True, "this model is a gguf file"),
    ("gguf", "gguf-split", ("m-00001-of-00002.gguf", "m-00002-of-00002.gguf"), False, "this model is a split GGUF set"),
    ("safetensors", "dir", ("config.json", "model.safetensors", "tokenizer.json"), False, ""),
    ("safetensors", "dir", ("config.json", "model.safetensors"), False, "refuses a model directory without tokenizer.json"),
    ("safetensors", "dir", ("tokenizer.json", "sub/model.safetensors"), False, "shards at the top of the model directory"),
    ("safetensors", "file", ("model.safetensors",), False, ""),
])
def test_which_models_each_engine_reads(fmt, layout, files, ds4_ok, colibri_needle):
    assert (ds4_reads_model(fmt, layout, files) == "") is ds4_ok
    why = colibri_reads_model(fmt, layout, files)
    assert (why == "") if not colibri_needle else (colibri_needle in why and "\n" not in why)

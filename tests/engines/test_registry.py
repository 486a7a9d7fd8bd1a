"""The registry of target engines: lookup, the default, and which engines split reads."""

from dataclasses import replace

import pytest

from core.errors import EXIT_USAGE, UsageError
from engines import colibri, ds4_argodrive, llamacpp
from engines.ds4_argodrive.blocks import split_ds4
from engines.ds4_argodrive.constants import BLOCK_BYTES, COMPONENT_BYTES
from engines.registry import DEFAULT_ENGINE, ENGINES, engine_for_model, get_engine, readers_of, register
from engines.split import check_weights, split_read


def test_every_engine_is_registered_under_its_own_name():
    assert set(ENGINES) == {ds4_argodrive.NAME, colibri.NAME, llamacpp.NAME}
    for name, engine in ENGINES.items():
        assert engine.name == name and get_engine(name) is engine


def test_an_unknown_engine_is_one_usage_line_naming_the_known_ones():
    with pytest.raises(UsageError) as info:
        get_engine("vllm")
    message = str(info.value)
    assert "\n" not in message and info.value.exit_code == EXIT_USAGE
    assert message == "engine 'vllm' is not known; known engines: ds4-argodrive, colibri, llama.cpp"


def test_the_default_engine_splits_reads_on_its_block_grid():
    engine = get_engine(DEFAULT_ENGINE)
    assert DEFAULT_ENGINE == ds4_argodrive.NAME
    assert engine.split is split_ds4 and engine.granule == BLOCK_BYTES
    assert (engine.max_sources, engine.weight_min, engine.weight_max) == (3, 1, 100)


def test_colibri_has_no_split_rule_and_split_read_says_which_engines_do():
    assert get_engine(colibri.NAME).split is None
    with pytest.raises(UsageError) as info:
        split_read(0, COMPONENT_BYTES, (10, 5), engine=colibri.NAME)
    assert str(info.value) == "engine 'colibri' does not split reads across sources; engines that do: ds4-argodrive"


def test_weight_limits_are_the_named_engines():
    assert check_weights((1, 1, 1, 1, 1), colibri.NAME) == (1, 1, 1, 1, 1)     # primary + 4 mirrors
    with pytest.raises(UsageError, match="colibri reads from at most 5 sources, got 6"):
        check_weights((1,) * 6, colibri.NAME)
    with pytest.raises(UsageError, match="ds4-argodrive reads from at most 3 sources, got 4"):
        check_weights((1,) * 4)
    with pytest.raises(UsageError, match="unknown-engine"):
        check_weights((1,), "unknown-engine")


def test_a_models_default_engine_is_the_one_that_claims_it_most_never_the_first_registered():
    gguf = ("gguf", "file", ("m.gguf",))
    ds4 = get_engine(ds4_argodrive.NAME)
    assert engine_for_model(*gguf) == ds4.name and engine_for_model("safetensors", "dir", ("a.safetensors",
                                                                                             "tokenizer.json")) == colibri.NAME
    # a GGUF file both claim as their format: the tie goes to ds4-argodrive by name; a split set only llama.cpp reads
    assert [e.name for e in readers_of(*gguf)] == [ds4.name, llamacpp.NAME]
    split = ("gguf", "gguf-split", ("m-00001-of-00002.gguf", "m-00002-of-00002.gguf"))
    assert engine_for_model(*split) == llamacpp.NAME

    def reads_gguf(fmt, layout, files):
        return "" if fmt == "gguf" else "reads GGUF only"

    shy = replace(ds4, name="000-reader", reads_model=reads_gguf, preference=None)          # claims 0
    made_for = replace(ds4, name="zzz-reader", reads_model=reads_gguf, preference=lambda *m: 2)
    tie = replace(ds4, name="aaa-reader", reads_model=reads_gguf, preference=lambda *m: 1)
    with register(shy):
        assert engine_for_model(*gguf) == ds4.name          # registered first and sorts first, but claims less
        with register(made_for):
            assert engine_for_model(*gguf) == "zzz-reader"
            assert [e.name for e in readers_of(*gguf)] == ["zzz-reader", ds4.name, llamacpp.NAME, "000-reader"]
    with register(tie):
        assert engine_for_model(*gguf) == "aaa-reader"      # a tie goes to the name that sorts first
    assert set(ENGINES) == {ds4_argodrive.NAME, colibri.NAME, llamacpp.NAME}
    with pytest.raises(UsageError, match="engine 'colibri' is already registered"):
        with register(get_engine(colibri.NAME)):
            pass
    assert get_engine(colibri.NAME) is colibri.ENGINE

"""ds4-argodrive's environment, arguments and log lines (docs/engine-profiles.md), as the engine module holds them."""

from engines.colibri import constants as coli, mirror_env
from engines.ds4_argodrive import constants as ds4, ds4_log, ds4_profile
from engines.ds4_argodrive.ds4_log import ReaderLog, read_log

# Lines as the engine prints them (its reader's fprintf formats), two reader sessions.
LOG = """\
ds4: Argodrive primary expert descriptor F_NOCACHE=1; mmap/Engram descriptor unchanged
ds4: experimental Argodrive expert reader sources=3; Engram unchanged
ds4: Argodrive decode split 10,6,6 (prefill keeps the base weights)
ds4:   streaming expert cache budget=4600 experts entries=4600 expert=19.00 MiB target=85.35 GiB
ds4: Argodrive decode cache requested=4600 effective=4100 reserve_bytes=0
ds4: Argodrive source[0] bytes=1200000000
ds4: Argodrive source[1] bytes=0
ds4: Argodrive source[2] bytes=690000000
ds4: Argodrive source[0] lands_last=10 gap_ns=100 reads=50
ds4: Argodrive prefill stage rejected: reader invalid=0 sources=1
ds4: using locked cache cap: 4000 experts
ds4: experimental Argodrive expert reader sources=2; Engram unchanged
ds4: ignoring DS4_ARGODRIVE_DECODE_WEIGHTS=10,6 (want 3 comma-separated weights 1..100)
ds4:   streaming expert cache budget=3900 experts entries=3900
ds4: Argodrive source[1] bytes=5
ds4: Argodrive source[0] bytes=1
"""


def test_a_log_without_engine_lines_reports_nothing():
    assert read_log("ds4-bench: loading\nctx_tokens,prefill_tokens\n") == ReaderLog()


def test_every_line_the_launcher_confirms_is_read():
    r = read_log(LOG)
    assert r.sources == 2                                   # the last session's line
    assert r.decode_split == "10,6,6" and r.decode_ignored == "10,6"
    assert r.source_bytes == {0: 1_200_000_001, 1: 5, 2: 690_000_000}   # summed over sessions
    assert list(r.source_bytes) == [0, 1, 2]
    assert r.cache_budgets == (4600, 3900)
    assert r.decode_cache == ((4600, 4100),)
    assert r.cache_caps == ("using locked cache cap: 4000 experts",)
    assert r.prefill_rejected == "reader invalid=0 sources=1"


def test_a_decode_list_with_blanks_is_read_like_the_engine_reads_it():
    # ar_open parses the list with strtoul, which skips the blank after each comma, and prints
    # it verbatim: "10, 6, 6" is applied and confirmed as 10,6,6.
    r = read_log("ds4: Argodrive decode split 10, 6, 6 (prefill keeps the base weights)\n")
    assert r.decode_split == "10,6,6" and ds4_log.weights_text(" 10, 6,\t6") == "10,6,6"
    r = read_log("ds4: ignoring DS4_ARGODRIVE_DECODE_WEIGHTS=10, 6 (want 3 comma-separated weights 1..100)\n")
    assert r.decode_ignored == "10, 6" and r.decode_split is None


def test_a_rejected_configuration_is_not_a_read_of_zero_bytes():
    # ar_open rejects (a relative path, a 4th source, a size or inode clash) by calling ar_close,
    # which prints bytes=0 for every source it had opened; the engine opens no reader.
    rejected = "ds4: Argodrive source[0] bytes=0\nds4: Argodrive source[1] bytes=0\n"
    assert read_log(rejected).rejected
    assert not read_log("ds4: experimental Argodrive expert reader sources=2; Engram unchanged\n" + rejected).rejected
    assert not read_log(LOG).rejected and not read_log("").rejected
    assert not read_log("ds4: Argodrive source[0] bytes=0\nds4: Argodrive source[1] bytes=7\n").rejected


def test_lands_last_lines_are_not_byte_counts():
    assert read_log("ds4: Argodrive source[0] lands_last=10 gap_ns=100 reads=50\n").source_bytes == {}


def test_the_split_environment_of_three_sources():
    env = ds4_profile.split_environment(10, ("/g/model.gguf", "/w/model.gguf"), (5, 5), (10, 6, 6))
    assert env == (("DS4_ARGODRIVE_PRIMARY_WEIGHT", "10"),
                   ("DS4_ARGODRIVE_REPLICAS", "/g/model.gguf*5,/w/model.gguf*5"),
                   ("DS4_ARGODRIVE_DECODE_WEIGHTS", "10,6,6"))
    assert tuple(k for k, _ in env) == ds4.SPLIT_KEYS
    assert ds4_profile.split_environment(10, (), (), (10,)) == ()     # one source: no split, no keys


def test_the_arguments_a_profile_owns():
    args = ds4_profile.engine_args("/i/model.gguf", 4600)
    assert args == ("--ssd-streaming", "-m", "/i/model.gguf", "--ssd-streaming-cache-experts", "4600")
    # The launcher refuses these after `--`: the profile already gives them.
    assert ds4.PROFILE_ARGS == {"-m", "--model", "--ssd-streaming-cache-experts"}


def test_known_keys_are_presence_flags_or_values_and_never_split_keys():
    assert set(ds4.PRESENCE_FLAGS).isdisjoint(ds4.VALUE_KEYS)
    assert set(ds4.KNOWN_KEYS) == set(ds4.PRESENCE_FLAGS) | set(ds4.VALUE_KEYS)
    assert set(ds4.KNOWN_KEYS).isdisjoint(ds4.SPLIT_KEYS)
    assert all(k.startswith(ds4.ENV_PREFIX) for k in ds4.KNOWN_KEYS + ds4.SPLIT_KEYS + (ds4.ENV_TIMING_SUMMARY,))
    assert ds4.ENV_PREFILL_SPLIT in ds4.PRESENCE_FLAGS


def test_colibri_environment():
    # The coli launcher reads COLI_MODEL, the engine binary SNAP: a profile gives both.
    assert mirror_env.plan_environment("/i/m", (), (10,)) == (("COLI_MODEL", "/i/m"), ("SNAP", "/i/m"))
    assert mirror_env.plan_environment("/i/m", ("/g/m", "/w/m"), (10, 5, 5)) == (
        ("COLI_MODEL", "/i/m"), ("SNAP", "/i/m"), ("COLI_MODEL_MIRROR", "/g/m;/w/m"), ("COLI_DISK_WEIGHTS", "10,5,5"))
    assert set(coli.ENV_KEYS) == {"COLI_MODEL", "SNAP", "COLI_MODEL_MIRROR", "COLI_DISK_WEIGHTS", "SNAP_MIRROR",
                                     "COLI_MODEL_DIRS", "DIRECT", "COLI_MIR_STRIPE"}

"""planner.measured: a harness run's results.json read back (the tuner's and the harness's one parser)."""

import json
import os

import pytest

from core.errors import MissingError, RigError
from planner.measured import RESULTS_KEYS, parse_results, read_results
from planner.tui.load import latest_measured
from tests.planner.helpers import write_harness_results


@pytest.fixture
def results_doc(tmp_path):
    write_harness_results(tmp_path / "run")
    with open(tmp_path / "run" / "results.json") as f:
        return json.load(f)


def test_a_harness_document_parses_into_its_arms(results_doc):
    run = parse_results(results_doc)
    assert (run.created, run.control) == ("2026-11-29T19:40:00Z", "1drive")
    assert [a.name for a in run.arms] == ["1drive", "3drives"]
    one, three = run.arm("1drive"), run.arm("3drives")
    assert (one.n, one.n_failed, one.tps) == (2, 0, {"prefill": 11.0, "decode": 2.0})
    assert three.sources == ("/p", "/a", "/b")
    assert three.weights == {"prefill": (2, 1, 1), "decode": (5, 3, 2)}
    with pytest.raises(KeyError):
        run.arm("nope")


def test_a_null_median_stays_unknown(results_doc):
    results_doc["medians"]["3drives"].update(prefill_tps=None, gen_steady_tps=True, n=None)
    three = parse_results(results_doc).arm("3drives")
    assert three.tps == {"prefill": None, "decode": None} and three.n == 0


@pytest.mark.parametrize("change, says", [
    (lambda d: d.update(kind="plan"), "not a bench results file (kind is 'plan'"),
    (lambda d: d.update(schema=2), "key 'schema' is 2, this version reads 1"),
    (lambda d: d.update(schema=True), "key 'schema' is True"),
    (lambda d: d.pop("medians"), "keys missing: medians"),
    (lambda d: d.update(arms=[1]), "key 'arms' is not an object of arms"),
    (lambda d: d.update(medians=[]), "key 'medians' is not an object of arms"),
    (lambda d: d["arms"].update({"x": 3}), "key 'arms.x' is not an object"),
    (lambda d: d["arms"]["1drive"].update(sources="/p"), "key 'arms.1drive.sources' is not a list of paths"),
    (lambda d: d["arms"]["1drive"].update(decode_weights=["5"]), "key 'arms.1drive.decode_weights' is not a list of integers"),
    (lambda d: d["medians"].update({"1drive": 7}), "key 'medians.1drive' is not an object"),
])
def test_malformed_documents_name_the_key(results_doc, change, says):
    change(results_doc)
    with pytest.raises(RigError) as e:
        parse_results(results_doc, "run/results.json")
    assert str(e.value).startswith("run/results.json: ") and says in str(e.value) and "\n" not in str(e.value)


def test_not_an_object_is_refused():
    with pytest.raises(RigError, match="kind is 'list'"):
        parse_results([])


def test_the_pinned_keys_are_the_ones_the_harness_writes(results_doc):
    assert tuple(results_doc) == RESULTS_KEYS


def test_read_results_goes_through_read_json(tmp_path):
    write_harness_results(tmp_path / "run")
    assert [a.name for a in read_results(str(tmp_path / "run" / "results.json")).arms] == ["1drive", "3drives"]
    with pytest.raises(MissingError, match="no such bench results file"):
        read_results(str(tmp_path / "none.json"))
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(RigError, match="not valid JSON"):
        read_results(str(tmp_path / "bad.json"))


def test_the_tuner_skips_a_newer_run_it_cannot_read(tmp_path):
    runs = tmp_path / "rig" / "runs"
    write_harness_results(runs / "20261129T194000Z")
    for stamp, text in (("20261129T195000Z", "{"), ("20261129T196000Z", json.dumps({"kind": "plan"}))):
        os.makedirs(runs / stamp)
        (runs / stamp / "results.json").write_text(text)
    (runs / "20261129T197000Z").write_text("a file, not a run folder")
    m = latest_measured(str(tmp_path / "rig"))
    assert {x.run for x in m} == {"20261129T194000Z"} and [x.arm for x in m] == ["1drive", "3drives"]

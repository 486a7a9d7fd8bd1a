"""What the replicas commands print: whole lines when piped, --quiet, the help's words."""

import os
import subprocess
import sys

import pytest

from replicas.sync import sync
from tests.helpers import write_random
from tests.replicas.helpers import PIECE, MiB, flip_byte, invoke


@pytest.fixture
def deep(tmp_path):
    """A rig whose members sit far deeper than 80 columns."""
    long = "replicas-on-a-drive-with-a-rather-long-mount-point-name"
    src = tmp_path / long / "internal" / "model.gguf"
    src.parent.mkdir(parents=True)
    data = write_random(src, 2 * MiB + 3, seed=11)
    dests = [tmp_path / long / name / "and-one-more-level-of-folders" for name in ("green", "white")]
    for d in dests:
        d.mkdir(parents=True)
    rig = str(tmp_path / "rig")
    assert sync(str(src), [str(d) for d in dests], rig, piece_size=PIECE, allow_same_device=True).exit_code == 0
    return rig, data, [str(src)] + [str(d / "model.gguf") for d in dests]


def whole_lines(text, paths):
    """Each path appears whole on one line, and nothing was cut with an ellipsis."""
    for p in paths:
        assert len(p) > 80
        assert any(p in line for line in text.splitlines()), (p, text)
    assert "repli…" not in text


@pytest.mark.parametrize("command", [["status"], ["verify"], ["verify", "--full"]])
def test_piped_tables_keep_paths_whole(deep, command):
    rig, data, paths = deep
    r = invoke(*command, "--rig", rig)
    assert r.exit_code == 0, r.output
    whole_lines(r.stdout, paths)


def test_a_real_pipe_keeps_paths_whole(deep):
    rig, data, paths = deep
    env = {**os.environ, "COLUMNS": "80"}
    p = subprocess.run([sys.executable, "-m", "replicas.cli", "status", "--rig", rig], capture_output=True,
                       text=True, env=env)
    assert p.returncode == 0, p.stderr
    whole_lines(p.stdout, paths)


def test_sync_and_the_mismatch_lines_keep_paths_whole(deep):
    rig, data, paths = deep
    r = invoke("sync", "--rig", rig, "--piece-size", "1M", "--allow-same-device", paths[0],
               *[os.path.dirname(p) for p in paths[1:]])
    assert r.exit_code == 0
    whole_lines(r.stdout, paths[1:])
    flip_byte(paths[2], 5)
    r = invoke("verify", "--rig", rig)
    assert r.exit_code == 1
    assert f"{paths[2]}: bad piece 0 at byte 0, {PIECE} bytes" in r.stderr.splitlines()


def test_quiet_leaves_only_the_result_and_errors(deep, monkeypatch):
    rig, data, paths = deep
    monkeypatch.setenv("REPLICAS_PROGRESS", "1")         # draw progress even though this is no terminal
    loud = invoke("verify", "--rig", rig, "--full")
    assert loud.exit_code == 0 and "verify" in loud.stderr and "MiB" in loud.stderr
    for quiet in ("--quiet", "-q"):
        r = invoke("verify", "--full", quiet, "--rig", rig)
        assert r.exit_code == 0 and r.stderr == "" and "identical" in r.stdout
    flip_byte(paths[1], 9)
    r = invoke("verify", "--quiet", "--rig", rig)
    assert r.exit_code == 1 and f"{paths[1]}: bad piece 0" in r.stderr and "identical" in r.stdout
    r = invoke("repair", "--quiet", "--rig", rig, paths[1])
    assert r.exit_code == 0 and r.stderr == "" and "re-copied 1 piece (1.0 MiB)" in " ".join(r.stdout.split())
    r = invoke("sync", "--quiet", "--rig", rig, "--piece-size", "1M", "--allow-same-device", paths[0],
               os.path.dirname(paths[1]))
    assert r.exit_code == 0 and r.stderr == "" and "identical" in r.stdout


def test_help_words():
    v = " ".join(invoke("verify", "--help").stdout.split())
    assert "PCT%" in v and "PCT%%" not in v
    usage = {cmd: next(line.strip() for line in invoke(cmd, "--help").stdout.splitlines() if "Usage:" in line)
             for cmd in ("sync", "verify", "hash", "repair", "forget", "status")}
    assert usage["sync"] == "Usage: replicas sync [OPTIONS] SOURCE [DEST_DIR]..."   # none: restore RAM members
    assert usage["verify"] == "Usage: replicas verify [OPTIONS] [PATH]..."
    assert usage["hash"] == "Usage: replicas hash [OPTIONS] FILE..."
    assert usage["repair"] == "Usage: replicas repair [OPTIONS] PATH"
    assert usage["forget"] == "Usage: replicas forget [OPTIONS] PATH"
    assert usage["status"] == "Usage: replicas status [OPTIONS]"


def test_status_reads_whole_on_an_80_column_terminal(deep):
    """At 80 columns status cut paths and states to '/…' and 'verifi…': now every path is there
    (folded), every state word whole, nothing cut with '…' below the title."""
    import io

    from rich.console import Console

    from core import rig as rigmod
    from replicas import views
    from replicas.manifests import load_manifest
    from replicas.status import member_status

    rig, data, paths = deep
    r = rigmod.load_rig(rig)
    manifest = load_manifest(r)
    buf = io.StringIO()
    Console(file=buf, width=80, force_terminal=True, color_system=None).print(
        views.status_table(r.root, manifest, member_status(r, manifest)))
    lines = buf.getvalue().splitlines()
    body = lines[next(i for i, line in enumerate(lines) if line.startswith("┏")):]   # the title abbreviates the digest
    assert all(len(line) <= 80 for line in lines)
    assert not any("…" in line for line in body), "\n".join(lines)
    cells = ["".join(line.split("│")[2].strip() for line in body if line.startswith("│"))]
    for p in paths:
        assert p in cells[0]                                   # the path column, folded, holds each path whole
    assert sum(line.count("verified") for line in body) == len(paths)

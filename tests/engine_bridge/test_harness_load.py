"""The load gate's decision on /proc/stat snapshots recorded on this project's 2-core test VM
(USER_HZ 100) around real arms (`engine-bridge run` on a synthetic model) and around reads
through a loop device; never on live load. How they were taken: docs/harness.md, "Calibrating
the load gate"."""

import pytest

from engine_bridge.harness.arms import MAX_OTHER_CPU, Snapshot, cpu_seconds, gate_load, kernel_cpu, other_cpu

TICKS = 100


def snap(t, proc_stat, own_utime, own_stime):
    """A Snapshot as runner.snapshot builds it, from a recorded /proc/stat and the harness's rusage."""
    busy, user = cpu_seconds(proc_stat, TICKS)
    return Snapshot(t=t, cpu_busy_s=busy, cpu_user_s=user, own_cpu_s=own_utime + own_stime, own_user_s=own_utime)


# An arm with nothing else running: 2.14 s, the arm used about 1.1 cores.
IDLE = (snap(3205.972, """cpu  142304 0 64431 367691 60101 0 1356 957 0 0
cpu0 55530 0 29402 202312 30755 0 104 492 0 0
cpu1 86773 0 35028 165378 29345 0 1252 465 0 0
""", 0.038, 0.0), snap(3208.115, """cpu  142506 0 64475 367691 60281 0 1356 957 0 0
cpu0 55580 0 29431 202312 30891 0 104 492 0 0
cpu1 86925 0 35043 165378 29390 0 1252 465 0 0
""", 2.047, 0.378))

# The same arm beside one `python -c 'while 1: pass'`.
ONE_LOOP = (snap(3210.917, """cpu  142542 0 64478 367691 60798 0 1356 957 0 0
cpu0 55612 0 29432 202312 31138 0 104 492 0 0
cpu1 86930 0 35046 165378 29660 0 1252 465 0 0
""", 2.048, 0.378), snap(3213.304, """cpu  142969 0 64517 367693 60805 0 1356 959 0 0
cpu0 55812 0 29462 202315 31144 0 104 492 0 0
cpu1 87157 0 35055 165378 29661 0 1252 466 0 0
""", 3.989, 0.759))

# The same arm beside two of them.
TWO_LOOPS = (snap(3214.106, """cpu  143029 0 64519 367742 60854 0 1356 959 0 0
cpu0 55842 0 29462 202364 31144 0 104 492 0 0
cpu1 87186 0 35056 165378 29710 0 1252 466 0 0
""", 6.574, 0.767), snap(3218.448, """cpu  143845 0 64567 367743 60856 0 1357 959 0 0
cpu0 56236 0 29500 202364 31145 0 104 492 0 0
cpu1 87609 0 35067 165378 29710 0 1253 466 0 0
""", 8.853, 1.122))

# `dd iflag=direct` reading a loop device (backing file in the page cache) at about 4.5 GB/s:
# the loop device's kworkers copy every byte in kernel time that no process of ours is charged.
LOOP_READS = (snap(3446.482, """cpu  174635 0 70978 368834 67628 0 1525 1090 0 0
cpu0 70781 0 33327 203215 34515 0 118 564 0 0
cpu1 103853 0 37650 165619 33113 0 1406 525 0 0
""", 0.134, 1.351), snap(3447.159, """cpu  174653 0 71052 368834 67663 0 1528 1090 0 0
cpu0 70791 0 33366 203215 34532 0 119 564 0 0
cpu1 103862 0 37686 165619 33130 0 1409 526 0 0
""", 0.143, 1.517))


def test_an_idle_machine_passes():
    assert other_cpu(*IDLE) == pytest.approx(0.005, abs=0.005)
    g = gate_load(*IDLE)
    assert g.ok and g.detail.startswith("others used 0.01 cores in user mode (limit 0.50); kernel 0.03 cores")


@pytest.mark.parametrize("pair, cores", [(ONE_LOOP, 0.975), (TWO_LOOPS, 1.355)])
def test_competing_busy_processes_fail(pair, cores):
    assert other_cpu(*pair) == pytest.approx(cores, abs=0.01)
    g = gate_load(*pair)
    assert not g.ok and g.detail.startswith(f"others used {other_cpu(*pair):.2f} cores in user mode (limit 0.50)")


def test_kernel_work_for_our_own_reads_is_not_competing_load():
    # All busy time not charged to us would read 1.15 cores and fail; in user mode others used 0.25.
    (b, a), wall = LOOP_READS, LOOP_READS[1].t - LOOP_READS[0].t
    all_not_ours = (a.cpu_busy_s - b.cpu_busy_s - (a.own_cpu_s - b.own_cpu_s)) / wall
    assert all_not_ours > 1.0 > MAX_OTHER_CPU
    assert other_cpu(b, a) == pytest.approx(0.253, abs=0.01)
    assert kernel_cpu(b, a) == pytest.approx(0.89, abs=0.02)
    g = gate_load(b, a)
    assert g.ok and "kernel 0.89 cores not charged to the arm" in g.detail


def test_the_limit_sits_between_idle_and_one_busy_process():
    assert other_cpu(*IDLE) * 10 < MAX_OTHER_CPU < other_cpu(*ONE_LOOP) / 1.5
    assert gate_load(*ONE_LOOP, max_other=1.0).ok and not gate_load(*IDLE, max_other=0.0).ok


def test_cpu_seconds_reads_the_aggregate_line():
    assert cpu_seconds("cpu  100 5 50 900 40 3 2 1 7 0\ncpu0 1 1 1 1 1 1 1 1 1 1\n", 100) == \
        pytest.approx((1.61, 1.05))
    assert cpu_seconds("intr 1 2 3\n", 100) == (0.0, 0.0)
    assert cpu_seconds("cpu  100 5 50 900\n", 100) == pytest.approx((1.55, 1.05))   # old kernels: 4 columns

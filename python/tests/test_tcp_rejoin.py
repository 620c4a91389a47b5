"""A replacement host rejoins a live TCP group, from Python (issue 32 item 5; docs/ELASTIC.md, "A
replacement host"; test_tcp_mask.py is the masking half). 2 hosts x 2 ranks in a
``ubep.make_tcp_group`` made elastic (UBEP_ELASTIC=1, read by make_tcp_group's default), each
rank with ``ubep.Buffer(..., mask_dead_ranks=True)`` in a loop of checked decode calls (latency
layout, bf16). Once every rank has made CALLS_BEFORE calls, the test SIGKILLs every process of
host 1; once the survivors run masked it starts host 1's launcher again, whose new ranks call
``make_tcp_group(rejoin=True)``, make the same Buffer and call as the others do.

Checked: every call of every rank (masked, and full after the rejoin) equals bit for bit the
NumPy reference of the ranks it ran with (reference.py); the survivors fail 0 to MAX_FAILED calls
at the fault and none after; they run exactly host 1 masked until the rejoin and nobody masked
after it; every rank makes FULL_CALLS full calls after it (the replacement's ranks never a masked
one); the survivors' descriptors after the rejoin are no more than before the fault; nothing of
any rank (the killed ones included) is left in /dev/shm. Printed: replacement launch -> each of
its ranks' first served call, and -> each survivor's first full call.

Inputs must be one problem on every rank, and nobody knows at which call the replacement comes:
problem 0 until masked, problem 1 while masked (the call that takes the replacement in is chosen
while masked), then problems 1, 2, 3 in turn counted from that call (the replacement counts from
its first).

    python3 test_tcp_rejoin.py launcher DIR [replacement]   (one per host; vhosts.sh's env)
    python3 test_tcp_rejoin.py rank DIR [replacement]       (one per rank; + UBEP_LOCAL_RANK)
"""
import os
import pickle
import signal
import socket
import subprocess
import sys
import time

import pytest

import test_tcp_mask as base

HOSTS, RPH, R, LOST = base.HOSTS, base.RPH, base.R, base.LOST
T, H, E, K = base.T, base.H, base.E, base.K
CALLS_BEFORE, FULL_CALLS, MAX_FAILED = 20, 40, 5
TIMEOUT = base.TIMEOUT
# The bound, replacement -> it serves, applies from its make_tcp_group call: before
# that, each new process starts Python and imports ubep (and torch, when installed: ~1 s here).
BOUND_S = 2.0
START_CAP_S = 30.0  # launch -> served, interpreter start included: a correctness cap only


def _path(work, name):
    return os.path.join(work, name)


def _touch(work, name):
    open(_path(work, name + ".tmp"), "w").close()
    os.rename(_path(work, name + ".tmp"), _path(work, name))


def _problem(rec, full_calls):
    if rec["replacement"]:
        return 1 + rec["calls"] % 3
    if not rec["masked_seen"]:
        return 0
    return 1 if rec["first_full_at"] is None else 1 + full_calls % 3


def _one_call(buf, me, problem):
    x, idx, w = base.inputs(me, problem)
    r = buf.dispatch(x, idx, w, layout="latency")
    got = dict(recv_x=r.recv_x.copy(), recv_count=r.recv_count.copy(), recv_src=r.recv_src.copy())
    got["y"] = buf.combine(base.expert_output(me, problem, r.recv_x.shape), r.handle).copy()
    return got


def _after_call(work, rec, view):
    """Bookkeeping of a completed call that ran under ``view``; True once it counts as full."""
    me = rec["rank"]
    rec["views"].append(view)
    rec["calls"] += 1
    if rec["calls"] == CALLS_BEFORE and not rec["replacement"]:
        rec["fds_before"] = base.open_fds()
        _touch(work, f"ready.{me}")
    if view:
        if not rec["masked_seen"]:
            rec["masked_seen"] = True
            _touch(work, f"masked.{me}")
        return False
    if rec["replacement"] or rec["masked_seen"]:
        if rec["first_full_at"] is None:
            rec["first_full_at"] = time.time()
        return True
    return False


def rank_main(work, role):
    started_at = time.time()
    import ubep
    imported_at = time.time()  # torch included, when installed (about 1 s)
    replacement = role == "replacement"
    # The live ranks take UBEP_ELASTIC=1 from the environment (make_tcp_group's default); the
    # replacement asks to rejoin in so many words.
    group = ubep.make_tcp_group(timeout=TIMEOUT, rejoin=True) if replacement else \
        ubep.make_tcp_group(timeout=TIMEOUT)
    grouped_at = time.time()
    me = group.rank
    buf = ubep.Buffer(group, hidden=H, num_experts=E, max_tokens_per_rank=T, max_topk=K,
                      dtype="bf16", mask_dead_ranks=True)
    rec = dict(rank=me, replacement=replacement, errors=[], wrong=[], views=[], calls=0,
               masked_seen=False, first_full_at=None, fds_before=None, pid=os.getpid(),
               at=dict(started=started_at, imported=imported_at, grouped=grouped_at, buffered=time.time()))
    full_calls = 0
    deadline = time.monotonic() + 60
    while full_calls < FULL_CALLS and time.monotonic() < deadline:
        problem = _problem(rec, full_calls)
        try:
            got = _one_call(buf, me, problem)
        except ubep.Error as e:
            rec["errors"].append(dict(type=type(e).__name__, msg=str(e), t=time.time(),
                                      after_rejoin=rec["first_full_at"] is not None))
            if len(rec["errors"]) > MAX_FAILED:
                break
            continue
        view = buf.masked_ranks()  # the view the call ran under (it changes only at a dispatch)
        bad = base.mismatches(got, base.expected(me, problem, view))
        if bad:
            rec["wrong"].append(dict(call=rec["calls"], problem=problem, view=view, bad=bad))
        if _after_call(work, rec, view):
            full_calls += 1
        time.sleep(0.002)  # "compute"
    rec["full_calls"] = full_calls
    rec["fds_after"] = base.open_fds()
    with open(_path(work, f"rec.{me}.tmp"), "wb") as f:
        pickle.dump(rec, f)
    os.rename(_path(work, f"rec.{me}.tmp"), _path(work, f"rec.{me}"))
    # Every rank waits for every other before leaving, so that no exit reads as a death.
    until = time.monotonic() + 30
    while not all(os.path.exists(_path(work, f"rec.{r}")) for r in range(R)):
        if time.monotonic() > until:
            break
        time.sleep(0.01)
    del buf, group
    import gc
    gc.collect()
    # Nothing left in this host's /dev/shm by this process, nor (the replacement, on the killed
    # host's /dev/shm) by the killed ranks: ubep's names carry the creator's pid.
    pids = [os.getpid()]
    if replacement and os.path.exists(_path(work, "victims")):
        pids += [int(p) for p in open(_path(work, "victims")).read().split()]
    left = [f for f in os.listdir("/dev/shm") if any(f"-{p}-" in f for p in pids)]
    with open(_path(work, f"left.{me}"), "w") as f:
        f.write(" ".join(left))
    os._exit(0)


def launcher_main(work, role):
    """One host: starts its ranks and records their pids (and its own) for the test's kill."""
    host = int(os.environ["UBEP_HOST_INDEX"])
    tag = f"{host}r" if role == "replacement" else str(host)
    procs = []
    for local in range(RPH):
        env = dict(os.environ, UBEP_LOCAL_RANK=str(local))
        log = open(_path(work, f"log.{tag}.{local}"), "w")
        procs.append(subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "rank", work, role], env=env, stdout=log,
            stderr=subprocess.STDOUT))
    with open(_path(work, f"pids.{tag}.tmp"), "w") as f:
        f.write(" ".join(str(p) for p in [os.getpid()] + [q.pid for q in procs]))
    os.rename(_path(work, f"pids.{tag}.tmp"), _path(work, f"pids.{tag}"))
    worst = 0
    for p in procs:
        rc = p.wait()
        worst = max(worst, rc if rc >= 0 else 128 - rc)
    sys.exit(worst)


# --- the test ----------------------------------------------------------------------------------

def _free_ports(n):
    """n distinct free ports on 127.0.0.1 (all held while probing, so none comes twice)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _launcher_cmd(work, role):
    return [sys.executable, os.path.abspath(__file__), "launcher", work] + (
        [role] if role else [])


def _start(where, work, env):
    """The first launch, and a function that starts the replacement host's launcher."""
    if where == "loopback":
        # Every host's door at a probed free port (UBEP_DOOR_PORTS; host 0's is the rendezvous),
        # not the rendezvous' port + h, which another socket of this machine may hold.
        ports = _free_ports(HOSTS)
        env = dict(env, UBEP_RENDEZVOUS=f"127.0.0.1:{ports[0]}", UBEP_HOSTS=str(HOSTS),
                   UBEP_RANKS_PER_HOST=str(RPH), UBEP_DOOR_PORTS=",".join(map(str, ports)))
        procs = [subprocess.Popen(_launcher_cmd(work, "live"),
                                  env=dict(env, UBEP_HOST_INDEX=str(h))) for h in range(HOSTS)]
        return procs, lambda: subprocess.Popen(_launcher_cmd(work, "replacement"),
                                               env=dict(env, UBEP_HOST_INDEX=str(HOSTS - 1)))
    # vhosts.sh shell makes the hosts and removes them when its command ends; the command writes
    # the hosts' name, for the replacement's `vhosts.sh launch-host` (into host 1's namespaces).
    name = _path(work, "vhosts.name")
    cmd = (f'echo "$UBEP_VHOSTS" > {name}; "$UBEP_VHOSTS_SCRIPT" launch "$UBEP_VHOSTS" {RPH} '
           + " ".join(_launcher_cmd(work, "live")))
    procs = [subprocess.Popen([base.VHOSTS, "shell", str(HOSTS), "bash", "-c", cmd], env=env)]

    def replace():
        hosts = open(name).read().strip()
        return subprocess.Popen([base.VHOSTS, "launch-host", hosts, str(RPH), str(HOSTS)]
                                + _launcher_cmd(work, "replacement"), env=env)
    return procs, replace


def _run(where, work, env):
    """Runs the scenario; returns (records by rank, kill time, replacement launch time, logs)."""
    procs, replace = _start(where, work, env)

    def logs():
        return "\n".join(f"--- {f}:\n{open(_path(work, f)).read()}"
                         for f in sorted(os.listdir(work)) if f.startswith("log."))

    survivors = [r for r in range(R) if r not in LOST]
    try:
        base.wait_for([_path(work, f"ready.{r}") for r in range(R)], 90,
                      "first calls on every rank", logs, procs)
        base.wait_for([_path(work, f"pids.{h}") for h in range(HOSTS)], 10, "pids", logs)
        victims = [int(p) for p in open(_path(work, f"pids.{HOSTS - 1}")).read().split()]
        with open(_path(work, "victims"), "w") as f:
            f.write(" ".join(map(str, victims)))
        killed_at = time.time()
        for pid in victims:  # the launcher first, so it cannot report its ranks' deaths
            os.kill(pid, signal.SIGKILL)
        base.wait_for([_path(work, f"masked.{r}") for r in survivors], 30,
                      "masked calls on the survivors", logs)
        time.sleep(0.1)  # a few masked calls first
        launched_at = time.time()
        procs.append(replace())
        base.wait_for([_path(work, f"left.{r}") for r in range(R)], 90, "every rank's results",
                      logs)
        for p in procs:
            p.wait(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
    recs = {r: pickle.load(open(_path(work, f"rec.{r}"), "rb")) for r in range(R)}
    return recs, killed_at, launched_at, logs


def _check_survivor(me, rec, killed_at):
    # A survivor fails the calls the loss caught in flight: usually 1, none when its call had
    # every row before the kill and the agreement masked the host before its next dispatch.
    assert len(rec["errors"]) <= MAX_FAILED, (me, rec["errors"])
    for e in rec["errors"]:
        assert e["type"] == "PeerFailedError", (me, e)
        assert e["t"] >= killed_at, (me, "failed before the kill", e)
        assert not e["after_rejoin"], (me, "failed after the rejoin", e)
    assert all(base.LOSS_SEEN.search(e["msg"]) for e in rec["errors"][:1]), (me, rec["errors"])
    # Full until the kill, then exactly the lost host masked, then full for good.
    views = rec["views"]
    first = next(i for i, v in enumerate(views) if v)
    back = next(i for i in range(first, len(views)) if not views[i])
    assert first >= CALLS_BEFORE and all(v == [] for v in views[:first]), (me, views)
    assert all(v == LOST for v in views[first:back]), (me, views[first:back])
    assert all(v == [] for v in views[back:]), (me, views[back:])
    assert rec["fds_after"] <= rec["fds_before"], (me, "descriptors grew", rec["fds_before"],
                                                   rec["fds_after"])


@pytest.mark.parametrize("where", ["loopback", "vhosts"])
def test_replacement_host_rejoins_and_every_call_is_right(tmp_path, where):
    import ubep
    if where == "vhosts":
        base.vhosts_or_skip()
    work = str(tmp_path)
    os.chmod(work, 0o755)
    env = dict(os.environ, UBEP_ELASTIC="1")
    env.pop("UBEP_REJOIN", None)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(ubep.__file__))), base.HERE,
         env.get("PYTHONPATH", "")])
    recs, killed_at, launched_at, logs = _run(where, work, env)
    for me, rec in recs.items():
        at = {k: f"{1e3 * (t - launched_at):.1f}" for k, t in rec["at"].items()}
        print(f"rank {me} ({where}{', replacement' if rec['replacement'] else ''}): "
              f"{rec['calls']} calls, {len(rec['errors'])} failed, replacement launch -> first "
              f"full call {1e3 * ((rec['first_full_at'] or 0) - launched_at):.1f} ms "
              f"(process start, ubep imported, group, Buffer at {at} ms), fds {rec['fds_before']} -> "
              f"{rec['fds_after']}")
    for me, rec in recs.items():
        first_ms = 1e3 * (rec["first_full_at"] - launched_at) if rec["first_full_at"] else -1
        assert 0 <= first_ms <= 1e3 * START_CAP_S, (me, first_ms)
        assert not rec["wrong"], (me, rec["wrong"][:3])
        assert rec["full_calls"] == FULL_CALLS, (me, rec["full_calls"], rec["errors"], logs())
        if rec["replacement"]:
            served_s = rec["first_full_at"] - rec["at"]["imported"]
            assert served_s <= BOUND_S, (me, "make_tcp_group -> first served call", served_s)
            assert me in LOST, me
            assert not rec["errors"], (me, rec["errors"])
            assert rec["views"] == [[]] * FULL_CALLS, (me, rec["views"])
        else:
            _check_survivor(me, rec, killed_at)
    assert sorted(r for r, rec in recs.items() if rec["replacement"]) == LOST
    for me in range(R):
        left = open(_path(work, f"left.{me}")).read().split()
        assert not left, (me, "left in /dev/shm", left)


def test_make_tcp_group_rejoin_flags_are_named(monkeypatch):
    import ubep
    monkeypatch.setenv("UBEP_REJOIN", "yes")
    with pytest.raises(ubep.InvalidArgument, match="rejoin not given and UBEP_REJOIN='yes'"):
        ubep.make_tcp_group("127.0.0.1:1", hosts=2, host=1, ranks_per_host=1, local_rank=0)
    with pytest.raises(ubep.InvalidArgument, match="elastic must be True or False, got 'on'"):
        ubep.make_tcp_group("127.0.0.1:1", hosts=2, host=1, ranks_per_host=1, local_rank=0,
                            elastic="on", rejoin=False)
    # UBEP_REJOIN=1 reaches the C++ launch: host 0 of 2 cannot be replaced (the partition rule
    # stops host 1 too when host 0 is lost), named before any socket.
    monkeypatch.setenv("UBEP_REJOIN", "1")
    with pytest.raises(ubep.InvalidArgument, match="host 0 of 2 cannot be replaced"):
        ubep.make_tcp_group("127.0.0.1:1", hosts=2, host=0, ranks_per_host=1, local_rank=0,
                            timeout=1)


if __name__ == "__main__":
    {"rank": rank_main, "launcher": launcher_main}[sys.argv[1]](
        sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "live")

"""Elastic EP with real processes (docs/ELASTIC.md): 3 ranks set up over torch.distributed (gloo,
FileStore) make ``ubep.Buffer(..., mask_dead_ranks=True, elastic_name=...)`` and run a decode
loop (latency layout); rank 1 SIGKILLs itself before its dispatch of iteration KILL_AT. The
survivors must get ``ubep.PeerFailedError`` "rank 1 died (signal 9)", go on masked, and see a
replacement started by this test (``ubep.make_rejoin_group(name, 1)`` + the same Buffer) come
back. Every completed call of every process is checked here against the NumPy reference of
the ranks it ran with (a masked rank's experts dropped). gloo is used for set-up only: after
the kill, no torch.distributed call is made.

The loops need not be in step after a change (a rank may fail a call its peer completed), so
every rank publishes the iteration whose inputs it is dispatching (a shared file), snapshots
them when its dispatch returns, and the check takes, per source, the iteration among the last
three it published whose reference matches every value (rows of any other call match none).

    python3 test_elastic_processes.py rank|replacement RANK STATE OUT NAME STORE   (one process)
"""
import itertools
import os
import pickle
import re
import signal
import subprocess
import sys
import time
import uuid

import numpy as np

import reference as ref

R, VICTIM, KILL_AT = 3, 1, 3
T, H, E, K = 6, 40, 6, 2
REPLACEMENT_IT0 = 1000  # the replacement's iterations: inputs of its own
TIMEOUT = 10.0  # s, every wait on a peer
DEADLINE = 30.0  # s, each process's loop, from the end of its set-up (a loaded machine
# can spend seconds importing torch; a run that meets its quotas ends at once)
MASKED_QUOTA, FULL_QUOTA = 2, 3
# Shared int64 slots: the iteration each rank dispatches now, quota met per rank, done per rank.
IT, QUOTA, DONE, NSLOTS = 0, R, 2 * R, 3 * R

# What a survivor's failed call says when the victim's death ends it.
DEATH_SEEN = re.compile(r"rank 1 died \(signal 9\)|rank \d left call \d+ to agree on a change")
HERE = os.path.dirname(os.path.abspath(__file__))


def spec_of(it):
    """Shapes, and a seed per iteration: the inputs of (rank, it) differ for every pair."""
    return ref.Spec(ranks=R, tokens=T, hidden=H, experts=E, topk=K, dtype="bf16", seed=1 + it)


def inputs(rank, it):
    return ref.make_inputs(spec_of(it), rank, it % 5)


def expert_output(rank, it, shape):
    return ref.make_expert_output(spec_of(it), rank, it % 5, shape)


def expected(me, its, masked):
    """The reference of rank ``me``'s call when rank r used the inputs of iteration its[r]: a
    masked rank sends nothing and its experts are dropped from every topk_idx."""
    spec = spec_of(0)
    xs, idxs, ws = ref.mask_inputs(spec, [inputs(r, its[r]) for r in range(R)], masked)
    disp, where = ref.dispatch_latency(spec, xs, idxs)
    outs = [expert_output(d, its[d], disp[d]["recv_x"].shape) for d in range(R)]
    ys = ref.combine_latency(spec, where, outs, idxs, ws)
    return dict(disp[me], y=ys[me])


def mismatches(got, exp):
    v = exp["valid"]
    bad = []
    for key, g, e in (("recv_count", got["recv_count"], exp["recv_count"]),
                      ("recv_x", got["recv_x"][v], exp["recv_x"][v]),
                      ("recv_src", got["recv_src"][v], exp["recv_src"][v]),
                      ("y", got["y"], exp["y"])):
        if g.shape != e.shape or not np.array_equal(g, e):
            bad.append(key)
    return bad


def check_call(me, call, what):
    """Finds the sources' iterations (each among the last three it published when this call's
    dispatch returned) whose reference equals every value of the call; fails naming the arrays
    that differ from the likeliest one if none does."""
    masked = call["view"]
    cands = []
    for s in range(R):
        if s == me:
            cands.append([call["it"]])
        elif s in masked:
            cands.append([0])  # sends nothing, receives nothing: its inputs do not matter
        else:
            cands.append([call["snap"][s] - d for d in (0, 1, 2) if call["snap"][s] - d >= 0])
    first = None
    for its in itertools.product(*cands):
        bad = mismatches(call["got"], expected(me, its, masked))
        if not bad:
            return its
        first = first or (its, bad)
    raise AssertionError(f"{what}: rank {me} iteration {call['it']} (masked {masked}): no "
                         f"iteration of the sources among {cands} gives these values; with "
                         f"{first[0]} these differ: {first[1]}")


# --- one process --------------------------------------------------------------------------

def _worker(role, me, state_path, out_path, name, store):
    state = np.memmap(state_path, dtype=np.int64, mode="r+", shape=(NSLOTS,))
    start = time.monotonic()
    rec = _loop(role, me, state, start, name, store)
    import gc
    gc.collect()  # the Buffer and Group are gone: a departure ends the peers' open calls at once
    rec["run_s"] = time.monotonic() - start
    state[DONE + me] = 1
    # Alive until everyone is done, so that no exit is taken for a death.
    while not all(state[DONE + r] for r in range(R)) and time.monotonic() - start < DEADLINE + 30:
        time.sleep(0.01)
    with open(out_path, "wb") as f:
        pickle.dump(rec, f)
    os._exit(0)  # no torch.distributed teardown with a dead peer


def _loop(role, me, state, start, name, store):
    import ubep
    kw = dict(hidden=H, num_experts=E, max_tokens_per_rank=T, max_topk=K, dtype="bf16",
              mask_dead_ranks=True)
    if role == "replacement":
        group = ubep.make_rejoin_group(name, me, timeout=TIMEOUT)
        buf = ubep.Buffer(group, **kw)
        it = REPLACEMENT_IT0
    else:
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=me, world_size=R)
        buf = ubep.Buffer(dist.group.WORLD, timeout=TIMEOUT, elastic_name=name, **kw)
        dist.barrier()  # set-up done everywhere; from here on, no torch.distributed call
        it = 0
    rec = dict(calls=[], errors=[], setup_s=time.monotonic() - start, deadline=False)
    loop_start = time.monotonic()
    seen_death = False
    masked_calls = full_after = 0

    def all_met():
        return all(state[QUOTA + r] for r in range(R))

    while not all_met():
        if time.monotonic() - loop_start > DEADLINE:
            rec["deadline"] = True
            break
        state[IT + me] = it
        if role == "rank" and me == VICTIM and it == KILL_AT:
            os.kill(os.getpid(), signal.SIGKILL)
        x, idx, w = inputs(me, it)
        try:
            r = buf.dispatch(x, idx, w, layout="latency")
            recv_x = r.recv_x
            snap = [int(v) for v in state[IT:IT + R]]
            view = buf.masked_ranks()
            got = dict(recv_x=recv_x.copy(), recv_count=r.recv_count.copy(),
                       recv_src=r.recv_src.copy())
            y = buf.combine(expert_output(me, it, recv_x.shape), r.handle)
            got["y"] = y.copy()
        except ubep.Error as e:
            msg = str(e)
            rec["errors"].append(dict(it=it, type=type(e).__name__, msg=msg, tail=all_met()))
            # A survivor learns of the death either from the death watch, or first from the
            # other survivor leaving the call to agree on the change (under load, that one can
            # be seen first); before the kill nothing else changes the group.
            seen_death = seen_death or bool(DEATH_SEEN.search(msg))
            it += 1
            continue
        rec["calls"].append(dict(it=it, snap=snap, view=view, got=got,
                                 after_death=seen_death))
        if view:
            masked_calls += 1
        elif seen_death or role == "replacement":
            full_after += 1
        if (role == "replacement" and full_after >= FULL_QUOTA) or (
                seen_death and masked_calls >= MASKED_QUOTA and full_after >= FULL_QUOTA):
            state[QUOTA + me] = 1
        if view:
            time.sleep(0.005)  # masked, waiting for the replacement: fewer calls to check
        it += 1
    rec["final_view"] = buf.masked_ranks()
    return rec


# --- the test ----------------------------------------------------------------------------

def test_sigkill_masks_then_replacement_rejoins(tmp_path):
    import ubep
    name = "pyel-" + uuid.uuid4().hex[:12]
    state_path = str(tmp_path / "state")
    np.zeros(NSLOTS, dtype=np.int64).tofile(state_path)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(ubep.__file__))), HERE,
         env.get("PYTHONPATH", "")])
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")

    def start(role, r):
        out = str(tmp_path / f"{role}{r}.pkl")
        log = open(tmp_path / f"{role}{r}.log", "w")
        p = subprocess.Popen([sys.executable, os.path.abspath(__file__), role, str(r),
                              state_path, out, name, str(tmp_path / "store")],
                             stdout=log, stderr=subprocess.STDOUT, env=env)
        return p, out, tmp_path / f"{role}{r}.log"

    procs = {("rank", r): start("rank", r) for r in range(R)}

    def logs():
        return "\n".join(f"--- {k}: {v[2].read_text()}" for k, v in procs.items()
                         if v[2].exists())

    try:
        victim = procs[("rank", VICTIM)][0]
        assert victim.wait(timeout=60) == -signal.SIGKILL, logs()
        procs[("replacement", VICTIM)] = start("replacement", VICTIM)
        for key, (p, _, _) in procs.items():
            if key != ("rank", VICTIM):
                assert p.wait(timeout=120) == 0, f"{key} exited {p.returncode}\n{logs()}"
    finally:
        for p, _, _ in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    pids = [p.pid for p, _, _ in procs.values()]
    recs = {k: pickle.load(open(v[1], "rb")) for k, v in procs.items() if k != ("rank", VICTIM)}

    for (role, me), rec in recs.items():
        what = f"{role} {me}"
        print(f"{what}: set-up {rec['setup_s']:.2f} s, run {rec['run_s']:.2f} s, "
              f"{len(rec['calls'])} calls, errors {[e['msg'][:60] for e in rec['errors']]}")
        assert not rec["deadline"], f"{what}: loop ran out of time\n{logs()}"
        # Errors: the death (and calls failing around the agreements), then the tail only.
        for e in rec["errors"]:
            assert e["type"] == "PeerFailedError" or e["tail"], (what, e)
        calls = rec["calls"]
        assert rec["final_view"] == [], (what, rec["final_view"])
        if role == "rank":
            died = [e for e in rec["errors"] if DEATH_SEEN.search(e["msg"])]
            assert died, (what, rec["errors"])
            assert died[0]["it"] == KILL_AT, (what, died[0])
            before = [c for c in calls if not c["after_death"]]
            assert [c["it"] for c in before] == list(range(KILL_AT)), (what, before)
            after = [c for c in calls if c["after_death"]]
            views = [c["view"] for c in after]
            # Masked first, then back to the full group for good.
            n_masked = next(i for i, v in enumerate(views) if v == [])
            assert n_masked >= MASKED_QUOTA, (what, views[:10])
            assert views[:n_masked] == [[VICTIM]] * n_masked, (what, views)
            assert all(v == [] for v in views[n_masked:]), (what, views)
            assert len(views) - n_masked >= FULL_QUOTA, (what, len(views), n_masked)
        else:
            assert len(calls) >= FULL_QUOTA and all(c["view"] == [] for c in calls), what
            assert calls[0]["it"] == REPLACEMENT_IT0, (what, calls[0]["it"], rec["errors"])
        for n, c in enumerate(calls):
            its = check_call(me, c, f"{what} call {n}")
            if not c["view"] and c["after_death"] or role == "replacement":
                # A full call after the rejoin pairs with the replacement's inputs.
                assert its[VICTIM] >= REPLACEMENT_IT0, (what, n, its)

    # Nothing left in /dev/shm: the rendezvous and every window of these processes.
    left = [f for f in os.listdir("/dev/shm")
            if f == f"ubep-rdv-{name}" or any(f.startswith(f"ubep-{pid}-") for pid in pids)]
    assert not left, left


if __name__ == "__main__":
    _worker(sys.argv[1], int(sys.argv[2]), *sys.argv[3:7])

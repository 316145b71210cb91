# SPDX-License-Identifier: Apache-2.0 OR MIT
"""Run-queue wait of the processes a benchmark measures, from /proc/PID/task/TID/schedstat.

schedstat's first field is a task's time on a cpu, its second the time it spent runnable on a
run queue without a cpu (nanoseconds; CONFIG_SCHED_INFO).  A round in which the measured
processes spent most of their runnable time waiting for a cpu, while other processes held most
of the cpus they may run on, was decided by whoever else held the cpus, not by the transport:
bench/seeds calls such a round starved and leaves it out of its medians and ratios
(bench/README.md, "Starved rounds", says why the two thresholds are what they are).

    w = Watch(server.pid, cpus={0, 1})   # the processes already running: sampled now
    w.add(client.pid)                    # one started after: counted from zero
    ...                                  # polled every 100 ms; descendants and threads too
    m = w.stop()                         # {'rq_wait_share', 'others_cpu_share', 'run_ms', ...}

Every reading is best effort: a process or thread that has gone keeps its last sample, a file
that cannot be read is skipped, and where schedstat is not there at all the shares are None.
"""
import os
import threading
import time

# Starved: the measured processes waited on a run queue for more than half of the time they
# were runnable, and other processes (or the hypervisor) had more than half of the cpu time of
# the cpus the measured processes may use.  The wait share alone cannot tell starvation from a
# measurement's own threads queueing behind each other: 8 client threads on one cpu wait 7/8 of
# the time with nobody else on the machine.
RQ_WAIT_THRESHOLD = 0.5
OTHERS_THRESHOLD = 0.5
INTERVAL = 0.1


def available():
    """None when this kernel gives per-thread schedstat, else why not."""
    try:
        fields = open(f"/proc/self/task/{threading.get_native_id()}/schedstat").read().split()
        if int(fields[0]) == 0 and int(fields[1]) == 0:
            # sched_info off: every thread reads "0 0 0", this one too after all it has run
            return "/proc/PID/task/TID/schedstat reads 0 0 (scheduler statistics off)"
        return None
    except (OSError, ValueError, IndexError, AttributeError) as e:
        return f"/proc/PID/task/TID/schedstat unreadable ({e.__class__.__name__}: {e})"


def cpu_idle():
    """{cpu: idle + iowait seconds} from /proc/stat ({} when it cannot be read)."""
    out = {}
    try:
        hz = os.sysconf("SC_CLK_TCK")
        for line in open("/proc/stat"):
            t = line.split()
            if len(t) > 5 and t[0].startswith("cpu") and t[0] != "cpu":
                out[int(t[0][3:])] = (int(t[4]) + int(t[5])) / hz
    except (OSError, ValueError):
        return {}
    return out


def _tasks(pid):
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []


def sample(pids):
    """{tid: (run_ns, wait_ns)} of every thread of pids and of all their descendants."""
    out, seen, todo = {}, set(), list(pids)
    while todo and len(seen) < 10000:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        for tid in _tasks(pid):
            try:
                f = open(f"/proc/{pid}/task/{tid}/schedstat").read().split()
                out[int(tid)] = (int(f[0]), int(f[1]))
            except (OSError, ValueError, IndexError):
                pass
            try:
                todo.extend(int(c) for c in open(f"/proc/{pid}/task/{tid}/children").read().split())
            except (OSError, ValueError):
                pass
    return out


def merge(base, last, now, done):
    """Folds a new sample into the last one seen of each thread.  A thread whose counters went
    backwards is a new thread under a reused id: the old thread's run and wait over the round go
    to done, and the new one counts from zero (it was born during the round)."""
    for tid, v in now.items():
        old = last.get(tid)
        if old is not None and (v[0] < old[0] or v[1] < old[1]):
            r0, w0 = base.pop(tid, (0, 0))
            done.append((max(0, old[0] - r0), max(0, old[1] - w0)))
        last[tid] = v


def share(base, last, done=()):
    """run and wait (ns) over a round and wait / (wait + run): base holds each thread's sample
    at the start, last its last sample (a thread missing from base was born during the round and
    counts from zero), done the run and wait of threads gone whose ids were reused."""
    run = wait = 0
    for tid, (r, w) in last.items():
        r0, w0 = base.get(tid, (0, 0))
        run += max(0, r - r0)
        wait += max(0, w - w0)
    for r, w in done:
        run += r
        wait += w
    return run, wait, (wait / (run + wait) if run + wait > 0 else None)


def others_share(wall_s, idle0, idle1, cpus, run_ns):
    """The part of the cpu time of cpus over wall_s that neither idled nor ran the measured
    processes (run_ns): other processes', interrupts' and the hypervisor's.  None without the
    idle times of those cpus."""
    cpus = [c for c in cpus if c in idle0 and c in idle1]
    if not cpus or wall_s <= 0:
        return None
    cap = wall_s * len(cpus)
    idle = sum(max(0.0, idle1[c] - idle0[c]) for c in cpus)
    return min(1.0, max(0.0, cap - idle - run_ns / 1e9) / cap)


def starved(rq_wait_share, others_cpu_share):
    """The verdict: both shares known and both above their thresholds."""
    return (rq_wait_share is not None and others_cpu_share is not None
            and rq_wait_share > RQ_WAIT_THRESHOLD and others_cpu_share > OTHERS_THRESHOLD)


class Watch:
    """Polls the schedstat of pids (and of those add()ed later, with all their descendants and
    threads) from now until stop(), in a thread of its own; cpus: those the processes may run
    on (None: all)."""

    def __init__(self, *pids, cpus=None, enabled=True, interval=INTERVAL):
        self.enabled = enabled
        self.pids = [p for p in pids if p]
        self.cpus = cpus
        self.interval = interval
        self.lock = threading.Lock()
        self.t0 = time.monotonic()
        self.idle0 = cpu_idle()
        self.base = sample(self.pids) if enabled else {}
        self.last = dict(self.base)
        self.done = []
        self.samples = 1
        self.stopping = threading.Event()
        self.thread = None
        if enabled:
            self.thread = threading.Thread(target=self._poll, daemon=True)
            self.thread.start()

    def add(self, pid):
        """A process started after the Watch: all its threads count from zero."""
        with self.lock:
            self.pids.append(pid)
        self._tick()

    def _tick(self):
        if not self.enabled:
            return
        with self.lock:
            pids = list(self.pids)
        now = sample(pids)
        with self.lock:
            merge(self.base, self.last, now, self.done)
            self.samples += 1

    def _poll(self):
        while not self.stopping.wait(self.interval):
            self._tick()

    def stop(self):
        if self.thread:
            self.stopping.set()
            self.thread.join(5)
        self._tick()
        wall = time.monotonic() - self.t0
        idle1 = cpu_idle()
        run, wait, s = share(self.base, self.last, self.done)
        cpus = self.cpus if self.cpus is not None else sorted(idle1)
        o = others_share(wall, self.idle0, idle1, cpus, run) if self.enabled else None
        return {"rq_wait_share": None if s is None else round(s, 4),
                "others_cpu_share": None if o is None else round(o, 4),
                "starved": starved(s, o), "run_ms": round(run / 1e6, 1),
                "wait_ms": round(wait / 1e6, 1), "wall_ms": round(wall * 1000, 1),
                "cpus": list(cpus), "tasks": len(self.last) + len(self.done),
                "samples": self.samples}

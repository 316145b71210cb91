# SPDX-License-Identifier: Apache-2.0 OR MIT
"""The papers' systems, built and started the same way for tests/py/test_seeds.py (data checks)
and bench/seeds (timings): nfs-ganesha with its VFS FSAL inside a network and mount namespace
of its own (with its own rpcbind on port 111), omniORB, Open MPI and MPICH.

Programs (sources beside this file, built into BUILD/seeds/ on first use):
  nfsbench      NFSv3 client over libnfs (nfsping, nfswrite, nfsread, pebbles)
  corba_echo    omniORB server and client of seeds_echo.idl
  mpi_pingpong  two-rank ping-pong and Allreduce, built with each MPI's mpicc

Every process started here is stopped by its PID.
"""
import os
import pathlib
import shutil
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BUILD = pathlib.Path(os.environ.get("BUILD", ROOT / "build"))
MEMLAN = BUILD / "bin" / "memlan"
OUT = BUILD / "seeds"
INSTALL = ROOT / "scripts" / "install-seeds.sh"

# What each system needs on PATH (or at a path), and the Debian package that brings it.
NEEDS = {
    "nfs": ["ganesha.nfsd", "rpcbind", "rpcinfo", "nfs-cp", "nfs-cat", "/usr/include/nfsc/libnfs.h",
            "unshare", "nsenter", "ip", "cc"],
    "omniorb": ["omniidl", "/usr/include/omniORB4/CORBA.h", "g++"],
    "openmpi": ["mpicc.openmpi", "mpirun.openmpi"],
    "mpich": ["mpicc.mpich", "mpiexec.mpich"],
}


def missing(system):
    return [p for p in NEEDS[system] if not (os.path.exists(p) if p.startswith("/") else shutil.which(p))]


def ensure(system):
    """None when the system's programs are there (installing them with scripts/install-seeds.sh
    when they are not), else the reason they cannot be had."""
    if not missing(system):
        return None
    r = subprocess.run([str(INSTALL)], capture_output=True, text=True, timeout=1800)
    left = missing(system)
    if not left:
        return None
    return (f"{', '.join(left)} not installed and scripts/install-seeds.sh could not install them "
            f"(exit {r.returncode}): {(r.stdout + r.stderr).strip()[-500:]}")


def _stale(target, *sources):
    return not target.exists() or any(s.stat().st_mtime > target.stat().st_mtime for s in sources)


def _cc(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"build failed: {' '.join(map(str, cmd))}\n{r.stdout}{r.stderr}")


def build(system):
    """Builds the system's programs (once, when their sources changed) and returns their paths."""
    OUT.mkdir(parents=True, exist_ok=True)
    if system == "nfs":
        exe = OUT / "nfsbench"
        if _stale(exe, HERE / "nfsbench.c"):
            _cc(["cc", "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-o", exe,
                 HERE / "nfsbench.c", "-lnfs"])
        return exe
    if system == "omniorb":
        exe = OUT / "corba_echo"
        idl, src = HERE / "seeds_echo.idl", HERE / "corba_echo.cc"
        if _stale(exe, idl, src):
            gen = OUT / "idl"
            gen.mkdir(exist_ok=True)
            _cc(["omniidl", "-bcxx", f"-C{gen}", idl])
            _cc(["g++", "-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{gen}", "-o", exe,
                 src, gen / "seeds_echoSK.cc", "-lomniORB4", "-lomnithread", "-pthread"])
        return exe
    if system in ("openmpi", "mpich"):
        exe = OUT / f"mpi_pingpong.{system}"
        if _stale(exe, HERE / "mpi_pingpong.c"):
            _cc([f"mpicc.{system}", "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-o", exe,
                 HERE / "mpi_pingpong.c"])
        return exe
    raise ValueError(system)


def memlan_wrap(argv, log=None, on=True):
    if not on:
        return list(argv)
    return [str(MEMLAN), "run"] + (["--log", str(log)] if log else []) + ["--"] + list(argv)


def pin(argv, cpu):
    return (["taskset", "-c", str(cpu)] if cpu is not None else []) + list(argv)


def stop(p, timeout=10):
    if p is None or p.poll() is not None:
        return
    p.terminate()
    try:
        p.wait(timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def _group_state(pgid):
    """comm, state and wchan of every process in a process group: what a hung run was doing."""
    rows = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            st = open(f"/proc/{d}/stat").read()
            fields = st[st.rindex(")") + 2:].split()
            if int(fields[2]) != pgid:
                continue
            comm = st[st.index("(") + 1:st.rindex(")")]
            wchan = open(f"/proc/{d}/wchan").read().strip() or "-"
            rows.append(f"{d} {comm} {fields[0]} {wchan}")
        except (OSError, ValueError):
            continue
    return "; ".join(rows)


def run_group(argv, timeout, started=None, **kw):
    """subprocess.run in a process group of its own: on a timeout every process of the group
    (a launcher's ranks included) is killed, and the error says what each was doing.
    started(pid), when given, is called as soon as the process is there."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         stdin=subprocess.DEVNULL, start_new_session=True, **kw)
    try:
        if started:
            started(p.pid)
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        state = _group_state(p.pid)
        try:
            os.killpg(p.pid, 9)
        except ProcessLookupError:
            pass
        out, err = p.communicate()
        raise RuntimeError(f"{argv[0]} still running after {timeout} s (killed; processes: "
                           f"{state}); output: {(out + err)[-600:]}")
    return subprocess.CompletedProcess(argv, p.returncode, out, err)


def ctx_switches(pid):
    """Voluntary and involuntary context switches of every thread of a process."""
    vol = inv = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for t in tasks:
        try:
            for line in open(f"/proc/{pid}/task/{t}/status"):
                if line.startswith("voluntary_ctxt_switches:"):
                    vol += int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches:"):
                    inv += int(line.split()[1])
        except OSError:
            pass
    return vol, inv


# ---- NFS: ganesha in a namespace of its own ------------------------------------------------

GANESHA_CONF = """NFS_CORE_PARAM {{
    Protocols = 3;
    Mount_Path_Pseudo = true;
    NFS_Port = {nfs_port};
    MNT_Port = {mnt_port};
    Enable_NLM = false;
    Enable_RQUOTA = false;
}}
NFSV4 {{ Graceless = true; }}
EXPORT {{
    Export_Id = 1;
    Path = {export};
    Pseudo = /export;
    Access_Type = RW;
    Squash = No_Root_Squash;
    Protocols = 3;
    Transports = TCP;
    SecType = sys;
    FSAL {{ Name = VFS; }}
}}
LOG {{ Default_Log_Level = WARN; }}
"""

NFS_PORT, MNT_PORT = 2049, 20048


def _listening(pid, port):
    """Is port listening in the network namespace of pid?  /proc/PID/net is that namespace's."""
    for f in (f"/proc/{pid}/net/tcp", f"/proc/{pid}/net/tcp6"):
        try:
            for line in open(f).read().splitlines()[1:]:
                p = line.split()
                if int(p[1].split(":")[1], 16) == port and p[3] == "0A":
                    return True
        except OSError:
            pass
    return False


class NfsServer:
    """A network and mount namespace (loopback only, a private /run) holding rpcbind and
    nfs-ganesha exporting work/export over NFSv3 on TCP.  Commands enter it with nsenter."""

    def __init__(self, work, memlan=False, cpu=None, log=None):
        self.work = pathlib.Path(work)
        self.export = self.work / "export"
        self.export.mkdir(parents=True, exist_ok=True)
        self.procs = []
        self.holder = self.rpcbind = self.ganesha = None
        # As root a plain network namespace; otherwise one inside a user namespace of our own.
        user = [] if os.geteuid() == 0 else ["-r"]
        self.holder = subprocess.Popen(
            ["unshare"] + user + ["-n", "-m", "--propagation", "private", "sh", "-c",
             "mount -t tmpfs seeds-run /run && mkdir -p /run/ganesha /run/rpcbind && "
             "ip link set lo up && echo ready && exec sleep 3600"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.holder.stdout.readline().strip()
        if line != "ready":
            err = self.holder.stderr.read() if self.holder.poll() is not None else ""
            self.close()
            raise RuntimeError(f"could not make the namespace: {line} {err}".strip())
        self.enter = ["nsenter", "-t", str(self.holder.pid)] + (
            ["-U", "--preserve-credentials"] if user else []) + ["-n", "-m"]
        try:
            self._start(memlan, cpu, log)
        except BaseException:
            self.close()
            raise

    def _start(self, memlan, cpu, log):
        self.rpcbind = subprocess.Popen(self.enter + ["--", "rpcbind", "-f"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._wait(111, self.rpcbind, "rpcbind")
        conf = self.work / "ganesha.conf"
        conf.write_text(GANESHA_CONF.format(nfs_port=NFS_PORT, mnt_port=MNT_PORT,
                                            export=self.export))
        self.glog = self.work / "ganesha.log"
        argv = ["ganesha.nfsd", "-F", "-L", str(self.glog), "-f", str(conf), "-p",
                "/run/ganesha/ganesha.pid"]
        self.ganesha = subprocess.Popen(self.enter + ["--"] + pin(memlan_wrap(argv, log, memlan), cpu),
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._wait(NFS_PORT, self.ganesha, "ganesha.nfsd", 60)
        self._wait(MNT_PORT, self.ganesha, "ganesha.nfsd (mountd)", 60)
        self._wait_registered(("100003", "100005"), 60)

    def _wait_registered(self, progs, timeout):
        """Until rpcbind knows the programs: ganesha registers them a little after it listens,
        and a client that asked in between read "Program is not available" for MOUNT (once in a
        CI run, over kernel TCP)."""
        rpcinfo = shutil.which("rpcinfo")
        if not rpcinfo:
            return
        end = time.time() + timeout
        while time.time() < end and self.ganesha.poll() is None:
            p = subprocess.run(self.enter + ["--", rpcinfo, "-p", "127.0.0.1"],
                               capture_output=True, text=True, timeout=30)
            have = {line.split()[0] for line in p.stdout.splitlines()[1:] if line.split()}
            if all(prog in have for prog in progs):
                return
            time.sleep(0.05)

    def _wait(self, port, proc, what, timeout=20):
        end = time.time() + timeout
        while not _listening(self.holder.pid, port):
            if proc.poll() is not None or time.time() > end:
                tail = ""
                if what.startswith("ganesha") and self.work.joinpath("ganesha.log").exists():
                    tail = self.work.joinpath("ganesha.log").read_text(errors="replace")[-800:]
                state = f"exited {proc.returncode}" if proc.poll() is not None else "still running"
                raise RuntimeError(f"{what} did not listen on {port} ({state}) {tail}")
            time.sleep(0.05)

    def cmd(self, argv):
        """argv run inside the namespace."""
        return self.enter + ["--"] + list(argv)

    def close(self):
        for p in (self.ganesha, self.rpcbind, self.holder):
            stop(p)


# ---- MPI -----------------------------------------------------------------------------------

OMPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "OMPI_MCA_rmaps_base_oversubscribe": "1"}
# Debian's MPICH 4.0 is ch4:ucx: UCX_TLS=self,tcp keeps UCX off its shared-memory transports
# and UCX_NET_DEVICES=lo on loopback; MPIR_CVAR_NOLOCAL=1 makes ranks on one host talk as if
# they were on two (no MPICH shared memory either).
MPICH_TCP_ENV = {"UCX_TLS": "self,tcp", "UCX_NET_DEVICES": "lo", "MPIR_CVAR_NOLOCAL": "1"}


def mpi_cmd(mpi, exe, args, transport="tcp", memlan=False, cpus=(None, None), logs=(None, None)):
    """The launcher command line for two ranks of exe, each rank `memlan run` (when memlan)
    and pinned to its cpu (None: not pinned), and the environment to run it with.
    transport: "tcp" (Open MPI's tcp BTL; MPICH's UCX over TCP) or "shm" (each MPI's own
    shared memory: Open MPI's vader BTL, MPICH's UCX defaults)."""
    env = dict(os.environ)
    ranks = [pin(memlan_wrap([str(exe)] + list(args), logs[r], memlan), cpus[r]) for r in (0, 1)]
    if mpi == "openmpi":
        env.update(OMPI_ENV)
        btl = "tcp,self" if transport == "tcp" else "vader,self"
        launch = ["mpirun.openmpi", "--allow-run-as-root", "--bind-to", "none", "--mca", "btl", btl,
                  "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo",
                  "--mca", "pml", "ob1"]
        # MPMD form: one rank per context, each with its own wrapper.
        argv = launch + ["-np", "1"] + ranks[0] + [":", "-np", "1"] + ranks[1]
    elif mpi == "mpich":
        if transport == "tcp":
            env.update(MPICH_TCP_ENV)
        launch = ["mpiexec.mpich", "-bind-to", "none"]
        argv = launch + ["-n", "1"] + ranks[0] + [":", "-n", "1"] + ranks[1]
    else:
        raise ValueError(mpi)
    return argv, env

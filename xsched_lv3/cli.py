"""xsched-lv3: run programs under the scheduler, run the daemon, inspect and hint.

Every failure a user can cause ends as one line on stderr and a non-zero exit code."""
import argparse
import errno
import json
import math
import os
import re
import shutil
import signal
import sys
from pathlib import Path

from kfdtool.cli.argtypes import non_empty, parse_command_line

from .board import Board
from .policy import HINTS, POLICIES, check_hint
from .protection import DEFAULT_LATENCY_SLACK, Protection
from .window import DEFAULT_WINDOW_US, check_window_us

EPILOG = """examples:
  xsched-lv3 run --priority 10 -- python serve.py   # latency-critical, unmodified PyTorch program
  xsched-lv3 run --priority 0 -- python train.py    # batch work, yields to it (no daemon needed)
  xsched-lv3 daemon &                               # optional: Lv3 on AMD (suspends lower clients' KFD
                                                    # queues), reaps dead clients, serves `hint`
  xsched-lv3 daemon --sim mi308x &                  # Lv3 against a simulated MI308X (`kfdtool sim start`)
  xsched-lv3 status
  xsched-lv3 hint --pid 1234 --priority 5
  xsched-lv3 hint --pid 1234 --utilization 25       # with --policy bandwidth

environment:
  XSCHED_LV3_BOARD   the shared board's file (default /dev/shm/xsched-lv3-<uid>.<version>.board): every
                     client, the daemon and `status` of one group must name the same one
  XSCHED_LV3_SOCKET  the daemon's socket, for clients of a daemon started with --socket
"""


class UsageError(ValueError):
    """The command was held wrong: exit 2 with argparse's `error:` line, as for a value argparse refuses."""


def _checked(check, parse=float):
    """An argparse type: the text parsed, then `check` (which raises ValueError with its reason)
    applied, so that an out-of-range value is a usage error (exit 2) like an unparsable one."""
    def convert(text):
        if not text.isascii():             # int() and float() take "１" (full-width): nobody means it
            raise argparse.ArgumentTypeError(f"wants ASCII digits, got {text!r}")
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"wants {'a whole number' if parse is int else 'a number'}, "
                                             f"got {text!r}") from None
        try:
            return check(value)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return convert


def _hint_arg(name):
    def check(value):
        try:
            return check_hint(name, value)
        except ValueError as e:            # argparse names the option already: not the hint's name again
            raise ValueError(re.sub(rf"^(hint )?{name} ", "", str(e))) from None
    return _checked(check, HINTS[name])


def _latency_slack(value):
    Protection(value)                      # its one check: a clear line here, not at `import torch`
    return value


def _trace_file(path):
    """The daemon's --trace, opened for appending without ever blocking it: a FIFO nobody reads is
    refused at once (open would wait for a reader), and a write that would block (a reader that
    stopped reading) is an error, which stops the tracing, not the scheduling."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as e:
        reason = "a FIFO with no reader" if e.errno == errno.ENXIO else (e.strerror or str(e))
        raise argparse.ArgumentTypeError(f"cannot write to {path}: {reason}") from None
    try:
        return os.fdopen(fd, "a")
    except OSError as e:                   # opened, yet not a file to append to (/proc/self/status: no seeking)
        os.close(fd)
        raise argparse.ArgumentTypeError(f"cannot append to {path}: {e.strerror or e}") from None


def _attached_poll_ms(value):
    if not 0.05 <= value <= 10_000:
        raise ValueError("must be between 0.05 and 10000")
    return value


def build_parser():
    p = argparse.ArgumentParser(prog="xsched-lv3", description="Preemptive GPU scheduling (XSched-style, Lv1/Lv3).",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")    # required: see parse_command_line
    d = sub.add_parser("daemon", help="run the multi-process scheduler (unix socket, no TCP)")
    d.add_argument("--policy", default="hpf", choices=list(POLICIES))
    d.add_argument("--max-level", type=int, choices=(1, 3), default=3,
                   help="3 (default): suspend lower-priority clients' KFD queues where the host allows "
                        "(Lv3), else their gates hold them (Lv1); 1: gates only")
    d.add_argument("--attached-poll-ms", type=_checked(_attached_poll_ms), metavar="MS",
                   help="how often an attached process's queue pointers are read to see it busy "
                        "(default 1, lv3.ATTACHED_POLL_S; see README)")
    d.add_argument("--trace", metavar="FILE", type=_trace_file,
                   help="append one line per Lv3 suspend and resume (monotonic time, pid, duration)")
    d.add_argument("--sim", metavar="NAME", type=non_empty, help="preempt through the simulated KFD NAME (`kfdtool sim start NAME`) "
                                                "instead of /dev/kfd")
    d.add_argument("--socket", type=non_empty, help="socket path (default $XDG_RUNTIME_DIR/xsched-lv3/daemon.sock, else "
                                    "/tmp/xsched-lv3-<uid>/daemon.sock; a 0700 directory); the daemon holds "
                                    "PATH.lock (and the board's BOARD.lock) while it runs. Clients find another PATH only through "
                                    "XSCHED_LV3_SOCKET=PATH in their environment")
    d.set_defaults(run=cmd_daemon)
    r = sub.add_parser("run", help="run a program with its PyTorch work scheduled",
                       description="Run a Python program with its PyTorch work scheduled: hooked at `import "
                                   "torch`, no code changes. A program that never imports torch (or is not "
                                   "Python) runs unscheduled and does not appear in `status`.")
    r.add_argument("--priority", type=_hint_arg("priority"), default=0,
                   help="higher runs first; a client with nobody above it on its GPU is never held (default 0)")
    r.add_argument("--policy", choices=list(POLICIES), default="hpf",
                   help="hpf: highest priority first (default); a running daemon's policy wins")
    r.add_argument("--window-us", type=_checked(check_window_us), default=None,
                   help=f"most GPU time this client leaves in flight while a higher-priority one shares its GPU "
                        f"(default {DEFAULT_WINDOW_US:g}; 0: unbounded)")
    r.add_argument("--latency-slack", type=_checked(_latency_slack), default=None, metavar="FRACTION",
                   help="hold lower-priority clients only while they cost this client's latency more than this "
                        f"fraction of its P99, judged from its own requests (default {DEFAULT_LATENCY_SLACK:g}; "
                        "0: hold them for every request, strict priority)")
    r.add_argument("--utilization", type=_hint_arg("utilization"), help="--policy bandwidth: this client's share of the GPU, percent")
    r.add_argument("--deadline-us", type=_hint_arg("deadline_us"), help="--policy kedf: deadline of a request, from its start")
    r.add_argument("--laxity-us", type=_hint_arg("laxity_us"), help="--policy laxity: raise to critical priority after this long")
    r.add_argument("argv", nargs=argparse.REMAINDER, help="-- program and arguments")
    r.set_defaults(run=cmd_run, parser=r)
    a = sub.add_parser("attach", help="schedule a running process without `run` (Lv3 only: KFD queue suspend)",
                       description="Schedule a running process that `xsched-lv3 run` did not start (LibTorch, HIP "
                                   "C++, any framework): the daemon suspends its KFD queues while a higher-priority "
                                   "client on its GPU is active, and, read from its queues' pointers, lets its own work hold "
                                   "lower-priority clients. Needs a daemon with Lv3; refused where Lv3 is not "
                                   "available for the process.",
                       epilog="examples:\n  xsched-lv3 attach --pid 4242 --priority 0 --device 24248\n"
                              "  xsched-lv3 detach --pid 4242", formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--pid", type=int, required=True)
    a.add_argument("--priority", type=_hint_arg("priority"), default=0)
    a.add_argument("--device", type=int, metavar="GPU_ID",
                   help="the KFD gpu_id its work runs on (default: counts on every GPU)")
    a.add_argument("--socket", type=non_empty)
    a.set_defaults(run=cmd_attach)
    dt = sub.add_parser("detach", help="stop scheduling an attached process (resumes it)")
    dt.add_argument("--pid", type=int, required=True)
    dt.add_argument("--socket", type=non_empty)
    dt.set_defaults(run=cmd_detach)
    s = sub.add_parser("status", help="scheduled clients: level and why, state, suspends, held time")
    s.add_argument("--json", action="store_true")
    s.add_argument("--socket", type=non_empty, help="the daemon's socket, if it was started with --socket")
    s.set_defaults(run=cmd_status)
    h = sub.add_parser("hint", help="change a scheduled process's hints (root or its owner)")
    h.add_argument("--pid", type=int, required=True)
    for name in HINTS:
        h.add_argument("--" + name.replace("_", "-"), dest=name, type=_hint_arg(name))
    h.add_argument("--socket", type=non_empty)
    h.set_defaults(run=cmd_hint, parser=h)
    return p


def cmd_daemon(args):
    from .daemon import Daemon
    from .lv3 import ATTACHED_POLL_S, Host
    host = Host(*_kfd_of(args.sim), max_level=args.max_level)
    poll_ms = ATTACHED_POLL_S * 1e3 if args.attached_poll_ms is None else args.attached_poll_ms
    daemon = Daemon(args.policy, args.socket, host=host, trace=args.trace, attached_poll_s=poll_ms / 1e3)
    lv3 = host.no_kfd or f"Lv3 through {'simulated ' + args.sim if args.sim else 'KFD'} ({host.grace_why})"
    daemon.serve(ready=lambda: print(f"xsched-lv3 daemon: policy {args.policy}, socket {daemon.socket_path}, "
                                     f"board {daemon.board.path}; {lv3}", flush=True))
    return 0


def _kfd_of(sim_name):
    """(open_kfd, sysfs root) of this host, or of a running simulated machine."""
    from kfdtool.device import KfdDevice
    if not sim_name:
        return (lambda: KfdDevice.open(os.environ.get("KFDTOOL_DEVICE", "/dev/kfd"))), None
    from kfdtool.errors import SimulatorError
    from kfdtool.sim import runner
    machine = runner.machine(sim_name)
    if not machine.is_running():
        raise SimulatorError(f"simulated {sim_name} is not running; start it with `kfdtool sim start {sim_name}`")
    return (lambda: KfdDevice(machine.open_kfd())), machine.sysfs_root


def cmd_run(args):
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        raise UsageError("nothing to run: xsched-lv3 run [options] -- program [args]")
    if not argv[0]:                        # execve refuses an empty name; env(1) says not found
        print("xsched-lv3: '': command not found", file=sys.stderr)
        return 127
    env = dict(os.environ, XSCHED_LV3_PRIORITY=str(args.priority),
               XSCHED_LV3_POLICY=args.policy)
    for name in ("XSCHED_LV3_BOARD", "XSCHED_LV3_SOCKET"):
        if env.get(name):                  # the program may change directory before it opens them
            env[name] = os.path.abspath(env[name])
    if args.window_us is not None:
        env["XSCHED_LV3_WINDOW_US"] = str(args.window_us)
    else:
        env.pop("XSCHED_LV3_WINDOW_US", None)
    if args.latency_slack is not None:
        env["XSCHED_LV3_LATENCY_SLACK"] = str(args.latency_slack)
    else:
        env.pop("XSCHED_LV3_LATENCY_SLACK", None)
    for name in ("utilization", "deadline_us", "laxity_us"):
        value = getattr(args, name)
        if value is not None:
            env["XSCHED_LV3_" + name.upper()] = str(value)
        else:
            env.pop("XSCHED_LV3_" + name.upper(), None)    # a run's hints come from its command line only
    try:
        Board().close()                    # usable: checked here, so the child does not fail at `import torch`
    except (OSError, ValueError) as e:
        # the job matters more than its scheduling: it runs, unscheduled, and the user is told once
        print(f"xsched-lv3: {_board_problem(e)}; running {argv[0]} unscheduled", file=sys.stderr)
    else:
        boot = str(Path(__file__).parent / "_boot")
        # (no empty entry: one would put the program's working directory on its sys.path)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (boot, env.get("PYTHONPATH")) if p)
        env["XSCHED_LV3_HOME"] = str(Path(__file__).resolve().parent.parent)    # where xsched_lv3 lives
    # Python ignores SIGPIPE and SIGXFSZ, and exec keeps an ignored signal ignored: the program gets
    # the dispositions it has without us (a pipeline's writer dies of its closed pipe, not loops on EPIPE)
    for signum in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(signum, signal.SIG_DFL)
    # as env(1), nice(1) and timeout(1) do: 127 for a command not found, 126 for one that cannot run
    try:
        _exec(argv, env)
    except FileNotFoundError:
        print(f"xsched-lv3: {argv[0]}: command not found", file=sys.stderr)
        return 127
    except PermissionError:
        print(f"xsched-lv3: {argv[0]}: permission denied (not executable?)", file=sys.stderr)
        return 126
    except OSError as e:                   # too long a name or argument list, a symlink loop, ...
        print(f"xsched-lv3: {_shortened(argv[0])}: cannot run it: {e.strerror or e}", file=sys.stderr)
        return 126


def _exec(argv, env):
    """execvp(3) as libc does it, which os.execvpe does not quite: a file found on PATH that the
    kernel cannot run (ENOEXEC: a script without `#!`) is run by /bin/sh, as env(1) and a shell run it."""
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as e:
        if e.errno != errno.ENOEXEC:
            raise
    path = argv[0] if "/" in argv[0] else shutil.which(argv[0], mode=os.X_OK, path=env.get("PATH", os.defpath))
    os.execve("/bin/sh", ["/bin/sh", path, *argv[1:]], env)


def _shortened(text, most=80):
    return text if len(text) <= most else text[:most] + "..."


def _finite(value):
    """`value` with every NaN or infinity (not JSON) replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def cmd_status(args):
    from .daemon_link import request
    board = Board()
    board.reap()
    daemon = board.daemon_pid()
    reply = {}
    refused = False
    if daemon or args.socket:              # a socket named on the command line is asked, and a wrong one said so
        try:
            reply = request({"op": "status"}, args.socket)
            if "error" in reply:           # e.g. at its connection cap: it says why, then closes
                refused = True
                raise ConnectionError(f"the daemon refused the request: {reply['error']}")
        except ConnectionError as e:       # not at this socket (--socket?), or not answering
            reply = {}
            print(f"xsched-lv3: {f'daemon pid {daemon}: ' if daemon else ''}{e}; showing the board", file=sys.stderr)
        daemon = daemon or reply.get("pid")    # one that answered at --socket is running, board or not
    if "clients" in reply:
        clients = reply["clients"]
    else:                                  # no daemon: what the board says, every client at Lv1
        why = "the daemon did not answer" if daemon else "Lv1: no daemon (`xsched-lv3 daemon` offers Lv3 on AMD)"
        clients = [{**board.client_status(i, s), "level": s.level if daemon else 1, "why": why, "suspended": False,
                    "suspends": 0, "suspended_s": 0.0} for i, s in board.slots()]
    if args.json:
        # strict JSON: a number another process of this user wrote into the board may be NaN
        print(json.dumps(_finite({"policy": reply.get("policy", board.policy()), "daemon": daemon or None,
                                  "clients": clients})))
        return 0
    if not clients:
        print("no scheduled clients" + ("" if daemon or refused else " (and no daemon running)"))
        return 0
    print(f"policy: {reply.get('policy', board.policy()) or 'per client'}; "
          f"daemon: {f'pid {daemon}' if daemon else 'refused (above)' if refused else 'none'}")
    print(f"{'PID':>8} {'TID':>8} {'PRIO':>5} {'DEVICE':>10} {'LEVEL':>5} {'STATE':<9} {'SUSPENDS':>8} "
          f"{'SUSP_S':>8} {'HELD_S':>8}  WHY")
    for c in clients:
        # exposing: its protection found that lower clients do not endanger it, so it lets them run
        # beside its requests (it is not marked active then, busy or not)
        state = "suspended" if c["suspended"] else "held" if c["held"] else "running" if c["active"] else \
            "exposing" if c.get("exposing") else "idle"
        tid = "attached" if c.get("attached") else c["tid"] or "-"
        print(f"{c['pid']:>8} {tid:>8} {c['priority']:>5} {c['device'] or '-':>10} "
              f"{'Lv' + str(c['level']):>5} {state:<9} {c['suspends']:>8} {c['suspended_s']:>8.3f} "
              f"{c['held_s']:>8.3f}  {c['why']}")
    return 0


def _ask_daemon(msg, socket):
    """The daemon's reply to `msg`; a refusal becomes the CLI's one-line error."""
    from .daemon_link import request
    reply = request(msg, socket)
    if "error" in reply:
        raise ValueError(reply["error"])
    return reply


def cmd_attach(args):
    msg = {"op": "attach", "pid": args.pid, "priority": args.priority}
    if args.device is not None:
        msg["device"] = args.device
    reply = _ask_daemon(msg, args.socket)
    print(f"pid {args.pid}: attached at priority {args.priority}; {reply['why']}")
    return 0


def cmd_detach(args):
    _ask_daemon({"op": "detach", "pid": args.pid}, args.socket)
    print(f"pid {args.pid}: detached (its queues run)")
    return 0


def cmd_hint(args):
    given = {name: getattr(args, name) for name in HINTS if getattr(args, name) is not None}
    if not given:
        raise UsageError("give at least one hint, e.g. --priority 5")
    for name, value in given.items():      # all checked (by argparse) before any is sent
        _ask_daemon({"op": "hint", "pid": args.pid, "name": name, "value": value}, args.socket)
    print(f"pid {args.pid}: " + ", ".join(f"{k}={v}" for k, v in given.items()))
    return 0


def _board_problem(error):
    """One line for what is wrong with the board (an OSError names the path and the reason)."""
    if isinstance(error, OSError):
        name = os.fsdecode(error.filename) if error.filename else ""
        return f"board {name + ': ' if name else ''}{error.strerror or error}"
    return str(error)


def main(argv=None):
    from kfdtool.errors import Error as KfdError
    if sys.stderr is None:
        # started with stderr closed (`2>&-`): Python's print(file=None) would put our messages into
        # standard output, which may be the output of the program `run` starts: they go nowhere
        sys.stderr = open(os.devnull, "w")
    parser = build_parser()
    args = parse_command_line(parser, argv)
    if sys.stdout is None and args.run not in (cmd_run, cmd_daemon):
        # started with stdout closed (`>&-`): nowhere to answer (a program run under us, or the
        # daemon, may well run without one)
        print("xsched-lv3: standard output is closed", file=sys.stderr)
        return 1
    try:
        return args.run(args)
    except UsageError as e:                # as argparse's own errors: the usage, then the error line
        args.parser.print_usage(sys.stderr)
        print(f"xsched-lv3 {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:                # (a ConnectionError) our output's reader went away: entry.run, quietly
        raise
    except (ValueError, ConnectionError, RuntimeError, KfdError) as e:
        print(f"xsched-lv3: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except OSError as e:
        if e.filename:                     # the board's path: a directory, a missing folder, ...
            print(f"xsched-lv3: {_board_problem(e)}", file=sys.stderr)
        else:                              # not a path's: our own output (a full disk, a closed pipe)
            print(f"xsched-lv3: {e.strerror or e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

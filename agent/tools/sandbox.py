"""The sandbox every ``exec`` command runs in: bubblewrap (``bwrap``), on Linux.

A command gets its own PID, IPC, UTS and cgroup namespaces, a user namespace in which it
cannot make another, and its own network namespace with only a loopback unless
``sandbox.network`` is on. It sees the system folders read-only (``/usr``, ``/bin``, ``/sbin``,
``/lib*``, and ``/etc`` without its secrets: shadow, sudoers, host and TLS keys...), a new
``/proc`` that shows only its own processes, a minimal ``/dev``, a private ``/tmp`` and the
workspace, at its own path: the one folder it can write. Nothing else — not the home folder,
``/var``, ``/run`` or ``/srv`` — and never the gateway's config file, data folder or log file,
which are covered even where they lie inside a folder it does see. Its environment (and that
of bwrap, its PID 1) is PATH, HOME (the workspace), LANG, TERM and TMPDIR: no key to read.

Everything a command starts dies with it: ``kill()`` (``sandbox_process.py``) kills the
sandbox's PID 1, which takes its whole PID namespace along (``setsid``, double forks and
daemons included), and returns once that has happened; a normal exit does the same, as PID 1
ends with the command. ``sandbox_probe.py`` decides once whether a sandbox can be made here.

Limits per command, set by ``prlimit`` inside the sandbox: CPU seconds (SIGXCPU, then SIGKILL
a second later), address space per process, file size, no core files, and processes. The last
needs care (measured on Linux 6.18 with bubblewrap 0.8):

- RLIMIT_NPROC counts the processes (and threads) of a real uid, and the kernel ignores it
  for the host's root whatever it says; CI runs as root.
- For any other user bwrap's user namespace is the answer: since Linux 5.14 the count is kept
  per (user namespace, uid), so the limit set *inside* the sandbox counts that command's
  processes only (two commands at 15 processes each both pass a limit of 20). Set before
  bwrap starts, it would count every process the user has on the host.
- For root, a pids cgroup per command (``sandbox_cgroup.py``), entered before bwrap forks: a
  fork loop stops at the limit, concurrent commands each get their own. A user namespace does
  not help root: bwrap maps the sandbox's uid to the caller's, so it is still uid 0 outside;
  and running bwrap as another uid would lose the workspace, whose files are root's.
- Root without a pids cgroup it may create: no sandbox, exec is off and says why.

The deny list in ``shell.py`` still runs first, as a seatbelt; this is the defence.
"""

from __future__ import annotations

import asyncio
import glob
import math
import os
from collections.abc import Iterable
from pathlib import Path

from agent.tools.base import ToolError
from agent.tools.sandbox_cgroup import CommandCgroup, PidsCgroups
from agent.tools.sandbox_process import SandboxedCommand, read_info
from gateway.kernel.config import ExecSandboxConfig
from gateway.kernel.frozen import frozen

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
SYSTEM_SECRETS = (
    "/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers",
    "/etc/sudoers.d", "/etc/ssl/private", "/etc/pki/tls/private", "/etc/letsencrypt",
    "/etc/wireguard", "/etc/NetworkManager/system-connections", "/etc/security/opasswd",
    "/etc/krb5.keytab", "/etc/credstore", "/etc/credstore.encrypted", "/etc/ipsec.secrets",
    "/etc/ppp/chap-secrets", "/etc/ppp/pap-secrets", "/etc/docker", "/etc/containers/auth.json",
    "/etc/parley", "/etc/ssh/ssh_host_*key",
)
"""Covered although under /etc: a root gateway's commands run as root (without capabilities),
so file permissions alone would not keep them out."""
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
_ENTER_CGROUP = 'echo $$ > "$0" && exec "$@"'
_MAX_ARGS = 60_000  # the options go through a pipe, written before bwrap reads it


def sandbox_env(workspace: Path) -> dict[str, str]:
    return {"PATH": SANDBOX_PATH, "HOME": str(workspace), "LANG": "C.UTF-8", "TERM": "dumb",
            "TMPDIR": "/tmp"}


def size_text(size: int) -> str:
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if size >= unit and size % unit == 0:
            return f"{size // unit} {name}"
    return f"{size} bytes"


@frozen(kw_only=True)
class SandboxSpec:
    """What a sandbox is made of: the config's settings and the host paths it must not show."""

    bwrap: str = "bwrap"
    network: bool = False
    cpu_seconds: int = 60
    memory: int = 1 << 30
    processes: int = 64
    file_size: int = 100 << 20
    ro_paths: tuple[Path, ...] = ()
    hidden: tuple[Path, ...] = ()

    @classmethod
    def from_config(cls, config: ExecSandboxConfig, private: Iterable[Path] = ()) -> SandboxSpec:
        """``private``: the gateway's own files (config, data, log), from the root."""
        return cls(bwrap=config.bwrap, network=config.network,
                   cpu_seconds=max(1, math.ceil(config.cpu_time)), memory=int(config.memory),
                   processes=config.processes, file_size=int(config.file_size),
                   ro_paths=tuple(config.ro_paths), hidden=(*private, *config.hide))


def _under(path: Path, roots: Iterable[Path]) -> bool:
    return any(path.is_relative_to(root) for root in roots)


def _outermost(paths: Iterable[Path]) -> list[Path]:
    unique = sorted(set(paths))
    return [p for p in unique if not any(p != q and p.is_relative_to(q) for q in unique)]


def check_workspace(workspace: Path) -> None:
    """A workspace holding a system folder would make it writable."""
    for name in ("/", *SYSTEM_DIRS):
        if Path(name).resolve().is_relative_to(workspace):
            raise ToolError(f"the workspace {workspace} contains {name}; exec cannot run "
                             "there (a sandbox would make the system writable)")


@frozen(kw_only=True)
class Sandbox:
    """A sandbox that works on this host: the binaries, what this bwrap supports, and where
    root's process limit lives (None: RLIMIT_NPROC in the user namespace does it)."""

    spec: SandboxSpec
    bwrap: str
    prlimit: str
    version: str
    tmpfs_size: bool = False
    disable_userns: bool = False
    cgroups: PidsCgroups | None = None

    def describe(self) -> str:
        spec = self.spec
        how = self.cgroups.describe() if self.cgroups else "RLIMIT_NPROC in a user namespace"
        return (f"bubblewrap {self.version}; network {'on' if spec.network else 'off'}; "
                f"limits: CPU {spec.cpu_seconds} s, memory {size_text(spec.memory)}, "
                f"{spec.processes} processes ({how}), files {size_text(spec.file_size)}")

    def options(self, workspace: Path) -> list[str]:
        """bwrap's options for a command in ``workspace``."""
        workspace = workspace.resolve()
        check_workspace(workspace)
        spec = self.spec
        opts = ["--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
                "--unshare-cgroup-try", "--hostname", "sandbox", "--die-with-parent",
                "--new-session", "--cap-drop", "ALL"]
        if not spec.network:
            opts.append("--unshare-net")
        if self.disable_userns:
            opts.append("--disable-userns")
        opts += ["--proc", "/proc", "--dev", "/dev"]
        if self.tmpfs_size:
            opts += ["--size", str(spec.memory)]
        opts += ["--tmpfs", "/tmp"]  # first: a folder shown below may be in /tmp
        visible = [workspace]
        for name in SYSTEM_DIRS:
            path = Path(name)
            if path.is_symlink():
                opts += ["--symlink", os.readlink(path), name]
            elif path.is_dir():
                opts += ["--ro-bind", name, name]
                visible.append(path.resolve())
        for extra in spec.ro_paths:
            real = extra.resolve()
            if real.exists():
                opts += ["--ro-bind", str(real), str(real)]
                visible.append(real)
        resolv = Path("/etc/resolv.conf").resolve()
        if spec.network and resolv.exists() and not _under(resolv, visible):
            opts += ["--ro-bind", str(resolv), str(resolv)]  # systemd-resolved's stub, in /run
        hidden = [p.resolve() for p in self._hidden()]
        hidden = [p for p in hidden if p.exists() and _under(p, visible)]
        outside = _outermost(p for p in hidden if not p.is_relative_to(workspace))
        inside = _outermost(p for p in hidden if p.is_relative_to(workspace))
        opts += [o for p in outside for o in _cover(p)]
        opts += ["--bind", str(workspace), str(workspace)]  # after: a cover may hold it
        opts += [o for p in outside if p.is_dir() for o in ("--remount-ro", str(p))]
        for path in inside:
            opts += _cover(path)
            if path.is_dir():
                opts += ["--remount-ro", str(path)]
        return [*opts, "--chdir", str(workspace)]

    def _hidden(self) -> list[Path]:
        out = [Path(p) for pattern in SYSTEM_SECRETS for p in glob.glob(pattern)]
        return out + [p.expanduser().absolute() for p in self.spec.hidden]

    def limits(self) -> list[str]:
        spec = self.spec
        return [self.prlimit, f"--cpu={spec.cpu_seconds}:{spec.cpu_seconds + 1}",
                f"--as={spec.memory}", f"--fsize={spec.file_size}",
                f"--nproc={spec.processes}", "--core=0", "--"]

    async def start(self, command: str, *, cwd: Path, stdout: int,
                    stderr: int) -> SandboxedCommand:
        """Start ``/bin/sh -c command`` in the sandbox, with ``cwd`` as the workspace."""
        options = self.options(cwd)
        info_r, info_w = os.pipe()
        args_r, args_w = os.pipe()
        try:
            init, info = await read_info(info_r)
        except BaseException:
            for fd in (info_w, args_r, args_w):
                os.close(fd)
            raise
        cgroup: CommandCgroup | None = None
        try:
            blob = memoryview(b"".join(os.fsencode(o) + b"\0"
                                       for o in [*options, "--info-fd", str(info_w)]))
            if len(blob) > _MAX_ARGS:
                raise ToolError("too many sandbox options (ro_paths, hide)")
            while blob:
                blob = blob[os.write(args_w, blob):]
            argv = [self.bwrap, "--args", str(args_r), "--", *self.limits(),
                    "/bin/sh", "-c", command]
            if self.cgroups is not None:
                cgroup = self.cgroups.create(self.spec.processes)
                argv = ["/bin/sh", "-c", _ENTER_CGROUP, str(cgroup.procs), *argv]
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                env=sandbox_env(cwd), cwd="/", start_new_session=True,
                pass_fds=(args_r, info_w))
        except BaseException:
            info.close()
            if cgroup is not None:
                await cgroup.kill_and_remove()
            raise
        finally:
            for fd in (args_r, args_w, info_w):
                os.close(fd)
        return SandboxedCommand(proc, init, info, cgroup)


def _cover(path: Path) -> list[str]:
    """Options that put something empty over ``path`` (read-only once ``--remount-ro``)."""
    return ["--tmpfs", str(path)] if path.is_dir() else ["--ro-bind", "/dev/null", str(path)]



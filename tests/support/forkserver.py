"""Run many `headprune` commands without paying the torch + transformers import each time.

The README test runs some 40 commands; importing torch and transformers is most of a small
command's time (about 5 s of 6 on 2 cores). `ForkServer` imports the CLI once in a server
process; a `headprune` shim on PATH sends its argv, working folder, environment and its
stdin/stdout/stderr file descriptors over a Unix socket, and the server forks a child that
takes those descriptors as its own and runs the same `main()` the console script runs. The
shim exits with the child's exit code, so shell pipes, redirections and `$?` behave as with
the installed script. The installed console script itself is exercised by
tests/cli/test_error_mapping.py.

Torch is imported, never run, before the fork: OpenMP thread pools start on first use, so
every child starts its own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

SERVER = textwrap.dedent("""
    import json, os, signal, socket, sys
    import torch, transformers  # the expensive part, paid once
    from transformers import BertModel, GPT2Model, LlamaModel  # noqa: F401  lazy model modules, warmed
    from headprune_cli.cli.app import main

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sys.argv[1])
    listener.listen(16)
    listener.settimeout(5)
    parent = os.getppid()
    print("ready", flush=True)
    while True:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            if os.getppid() != parent:  # the test process is gone (killed): do not outlive it
                sys.exit(0)
            continue
        conn.settimeout(None)
        message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        if os.fork():
            for fd in fds:
                os.close(fd)
            conn.close()
            continue
        listener.close()
        request = json.loads(message)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        sys.argv = ["headprune", *request["argv"]]
        code = 1
        try:
            code = main(request["argv"])
        except SystemExit as exc:
            code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:
                    pass
            conn.sendall(str(code if isinstance(code, int) else 1).encode())
            os._exit(0)
""")

SHIM = textwrap.dedent("""\
    #!{python}
    import json, os, socket, sys
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect({address!r})
    request = {{"argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ)}}
    socket.send_fds(conn, [json.dumps(request).encode()], [0, 1, 2])
    reply = b""
    while chunk := conn.recv(16):
        reply += chunk
    sys.exit(int(reply) if reply else 70)  # no reply: the child died before answering
""")


class ForkServer:
    """`with ForkServer(folder, env) as shim_env:` puts a `headprune` shim in folder/bin;
    `shim_env` is `env` with that folder first on PATH, for the commands to run."""

    def __init__(self, folder: Path, env: dict):
        self.folder, self.env = folder, env

    def __enter__(self) -> dict:
        address = str(self.folder / "headprune.sock")
        self.process = subprocess.Popen(
            [sys.executable, "-c", SERVER, address],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        if self.process.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the fork server did not start (exit {self.process.wait()})")
        bin_dir = self.folder / "bin"
        bin_dir.mkdir()
        shim = bin_dir / "headprune"
        shim.write_text(SHIM.format(python=sys.executable, address=address))
        shim.chmod(0o755)
        return {**self.env, "PATH": f"{bin_dir}{os.pathsep}{self.env['PATH']}"}

    def __exit__(self, *exc) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)  # the server and any child still running
        self.process.wait()

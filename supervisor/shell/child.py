"""The vLLM child process: spawn it in its own process group, stream both pipes line by line, stop it.

Lines can exceed 64 KiB, hold invalid UTF-8, NUL bytes or lone ``\\r`` (tqdm bars), or never end:
:class:`~supervisor.core.vllm_text.LineSplitter` turns arbitrary chunks into bounded lines (the same
lines ``vllm-guard diagnose`` reads from a file), so memory stays bounded whatever the child prints.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Callable, Mapping, Sequence

from supervisor.core.vllm_text import LineSplitter
from supervisor.shell import procs

CHUNK = 64 * 1024       # bytes read from a pipe at a time

LineHandler = Callable[[bytes, str], None]   # (line without newline, "stdout" | "stderr")


class Child:
    """One launch of vLLM."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], on_line: LineHandler,
                 state_dir: str | None = None) -> None:
        self.argv = list(argv)
        self.env = dict(env)
        self.on_line = on_line
        self.state_dir = state_dir
        self.proc: asyncio.subprocess.Process | None = None
        self.pid: int | None = None
        self.pgid: int | None = None
        self._readers: list[asyncio.Task[None]] = []
        self.tree: dict[int, float] = {}      # pid -> create_time of every process seen in the launch

    async def start(self) -> None:
        """Spawn; raises OSError (e.g. the command does not exist)."""
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.env,
            start_new_session=True,          # own session and process group
            preexec_fn=procs.preexec_pdeathsig,
        )
        self.pid = self.proc.pid
        self.pgid = self.proc.pid
        if self.state_dir:
            procs.record_launch(self.state_dir, self.pid, self.pgid)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._readers = [
            asyncio.create_task(self._pump(self.proc.stdout, "stdout")),
            asyncio.create_task(self._pump(self.proc.stderr, "stderr")),
        ]

    async def _pump(self, stream: asyncio.StreamReader, name: str) -> None:
        splitter = LineSplitter()
        while True:
            try:
                data = await stream.read(CHUNK)
            except (OSError, ValueError):
                break
            if not data:
                break
            for line in splitter.feed(data):
                self.on_line(line, name)
        for line in splitter.close():
            self.on_line(line, name)

    def remember_tree(self, record: bool = True) -> None:
        """Note the launch's processes now (engine and workers), to end or watch them later; ``record``:
        in ``launch.json`` too, for the next guard if this one is SIGKILLed."""
        if self.pid is None:
            return
        tree = procs.snapshot_tree(self.pid)
        for p in tree:
            try:
                self.tree.setdefault(p.pid, p.create_time())
            except Exception:
                continue
        if self.state_dir and record:
            # A second way for the next guard to find them if this one is SIGKILLed.
            procs.note_tree(self.state_dir, tree)

    def lost_processes(self) -> list[int]:
        """Pids of the launch's recorded processes that are gone (e.g. the engine died)."""
        import psutil

        gone = []
        for pid, created in self.tree.items():
            try:
                p = psutil.Process(pid)
                if p.create_time() != created or p.status() == psutil.STATUS_ZOMBIE:
                    gone.append(pid)
            except psutil.NoSuchProcess:
                gone.append(pid)
            except psutil.Error:
                continue
        return gone

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.returncode

    async def wait(self) -> int:
        assert self.proc is not None
        return await self.proc.wait()

    async def stop(self, grace: float, hurry: threading.Event | None = None) -> int | None:
        """SIGTERM the group and every process of the launch, SIGKILL after ``grace`` (at once when
        ``hurry`` is set), reap."""
        if self.proc is None:
            return None
        import psutil

        self.remember_tree(record=False)     # signal first; the disk is written after (it may be full or slow)
        victims = []
        for pid, created in self.tree.items():
            try:
                p = psutil.Process(pid)
                if p.create_time() == created:
                    victims.append(p)
            except psutil.Error:
                continue
        if self.state_dir:
            victims.extend(p for p in procs.marked_processes(self.state_dir)
                           if p.pid not in {v.pid for v in victims})
        await procs.end_processes_async(victims, self.pgid, grace, hurry)
        try:
            code = await asyncio.wait_for(self.proc.wait(), timeout=max(grace, 1.0) + 5)
        except TimeoutError:     # pragma: no cover - the kernel did not reap after SIGKILL
            try:
                os.killpg(self.pgid or self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            code = await self.proc.wait()
        await self.drain()
        if self.state_dir:
            procs.clear_launch(self.state_dir)
        return code

    async def drain(self, timeout: float = 2.0) -> None:
        """Let the readers deliver what is still in the pipes (bounded)."""
        if not self._readers:
            return
        done, pending = await asyncio.wait(self._readers, timeout=timeout)
        for t in pending:
            t.cancel()

"""The vLLM child process: spawn it in its own process group, stream both pipes line by line, stop it.

Lines can exceed 64 KiB, hold invalid UTF-8, NUL bytes or lone ``\\r`` (tqdm bars), or never end:
:class:`~supervisor.core.vllm_text.LineSplitter` turns arbitrary chunks into bounded lines (the same
lines ``vllm-guard diagnose`` reads from a file), so memory stays bounded whatever the child prints.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable, Mapping, Sequence

import structlog

from supervisor.core.vllm_text import LineSplitter
from supervisor.shell import procs, signalling
from supervisor.shell.signalling import Proc

CHUNK = 64 * 1024       # bytes read from a pipe at a time

LinesHandler = Callable[[list[bytes], str], None]   # (the lines of one read, without newlines; "stdout" | "stderr")

log = structlog.get_logger("vllm-guard")


class Child:
    """One launch of vLLM."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], on_lines: LinesHandler,
                 state_dir: str | None = None) -> None:
        self.argv = list(argv)
        self.env = dict(env)
        self.on_lines = on_lines
        self.handler_errors = 0               # reads whose lines a handler failed on (logged once)
        self.state_dir = state_dir
        self.proc: asyncio.subprocess.Process | None = None
        self.pid: int | None = None
        self.pgid: int | None = None
        self.leader: Proc | None = None       # the direct child, pinned at spawn
        self._readers: list[asyncio.Task[None]] = []
        self.tree: dict[int, Proc] = {}       # every process seen in the launch, by pid
        self._noted: set[tuple[int, float]] = set()   # identities written to launch.json

    async def start(self) -> None:
        """Spawn; raises OSError (e.g. the command does not exist)."""
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.env,
            start_new_session=True,          # own session and process group
            preexec_fn=signalling.die_with_parent,
        )
        self.pid = self.proc.pid
        self.pgid = self.proc.pid
        # Our unreaped child: its pid cannot be reissued yet, so this is its identity (None only
        # when it exited and was reaped already).
        self.leader = Proc.live(self.pid)
        if self.leader is not None:
            self.tree[self.pid] = self.leader
            if self.state_dir:
                procs.record_launch(self.state_dir, self.leader, self.pgid)
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
            lines = splitter.feed(data)
            if lines:
                self._handle(lines, name)      # a read's lines at once: the output path works per read
        rest = splitter.close()
        if rest:
            self._handle(rest, name)

    def _handle(self, lines: list[bytes], name: str) -> None:
        """Hand a read's lines on. A handler that fails loses those lines, never the pipe: a reader that
        stopped would leave vLLM blocked on its next write, a hang that looks like a stall."""
        try:
            self.on_lines(lines, name)
        except Exception as e:  # noqa: BLE001 - the pipe must be drained whatever a handler does
            self.handler_errors += 1
            if self.handler_errors == 1:
                log.error("vllm_output_handler_failed", error=f"{type(e).__name__}: {e}"[:300], stream=name)

    def remember_tree(self, record: bool = True) -> None:
        """Note the launch's processes now (engine and workers), to end or watch them later; ``record``:
        in ``launch.json`` too, for the next guard if this one is SIGKILLed."""
        if self.leader is None:
            return
        tree = signalling.snapshot_tree(self.leader)
        for p in tree:
            self.tree.setdefault(p.pid, p)
        if self.state_dir and tree and record:
            # A second way for the next guard to find them if this one is SIGKILLed.
            procs.note_tree(self.state_dir, tree)

    def note_descendants(self) -> None:
        """Write the launch's processes that ``launch.json`` does not hold yet (engine, workers, helpers
        spawned at any point of a start-up), for the next guard if this one is SIGKILLed: with the guard
        gone, its vLLM leader dies too (PDEATHSIG) and the engine is reparented, no longer a descendant of
        anything recorded; the marker in its environment is the other way to find it, and a process can
        rewrite or drop its environment (a re-exec with a clean one, a title library without SPT_NOENV).
        Not watched (``tree``): a helper that ends by itself is no engine lost."""
        if self.leader is None or not self.state_dir:
            return
        new = [p for p in signalling.snapshot_tree(self.leader) if (p.pid, p.start) not in self._noted]
        if new:
            procs.note_tree(self.state_dir, new)
            self._noted.update((p.pid, p.start) for p in new)

    def lost_processes(self) -> list[int]:
        """Pids of the launch's recorded processes that are gone (e.g. the engine died)."""
        return signalling.lost(self.tree.values())

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.returncode

    async def wait(self) -> int:
        """The direct child's exit status, as soon as it has exited.

        asyncio's ``Process.wait()`` returns only once the child's pipes are closed too, and an
        orphaned engine holds them (it inherited them): vLLM's API server can be long dead while
        ``wait()`` still waits. The status itself is known as soon as asyncio reaps the child, so
        it is read from ``returncode``, polled at 20 Hz beside the ``wait()``."""
        assert self.proc is not None
        waiter = asyncio.ensure_future(self.proc.wait())
        try:
            while self.proc.returncode is None and not waiter.done():
                await asyncio.wait({waiter}, timeout=0.05)
            return self.proc.returncode if self.proc.returncode is not None else waiter.result()
        finally:
            waiter.cancel()

    async def stop(self, grace: float, hurry: threading.Event | None = None) -> int | None:
        """End every process of the launch (the group while its leader lives, each recorded process,
        each carrying our marker): SIGTERM, SIGKILL after ``grace`` (at once when ``hurry`` is set,
        or for a stopped process), reap."""
        if self.proc is None:
            return None
        self.remember_tree(record=False)     # signal first; the disk is written after (it may be full or slow)
        state_dir = self.state_dir
        find = (lambda: procs.marked_processes(state_dir)) if state_dir else None
        victims = list(self.tree.values())
        if find is not None:
            victims.extend(p for p in find() if p.pid not in self.tree)
        await signalling.end_async(victims, self.pgid, grace, hurry, find)
        try:
            code = await asyncio.wait_for(self.wait(), timeout=max(grace, 1.0) + 5)
        except TimeoutError:     # pragma: no cover - the kernel did not reap after SIGKILL
            if self.leader is not None:
                signalling.send(self.leader, signal.SIGKILL)
            code = await self.wait()
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

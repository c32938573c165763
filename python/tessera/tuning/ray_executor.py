"""Compiling and measuring a search's candidates on Ray: ``ts.autotune(..., executor="ray")``.

This process plans and prunes as with local workers, reads and writes the tuning cache, and checks
and chooses; Ray workers do the rest, one candidate per call:

1. Compiling: ``workers`` Ray actors (:class:`RayPool`, the Ray form of :class:`WorkerPool`), each
   holding one CPU (one GPU on GPU targets, so that a build lands on a node that can run it), get one
   candidate at a time and compile it with :func:`compile_candidate` into their node's kernel cache.
   An actor leads a process group of its own; past ``compile_timeout`` a small task on its node kills
   that group (the actor and the compilers it started), the candidate fails with ``compile exceeded
   N s`` and a fresh actor takes the slot's next candidate.
2. Measuring, once every compile is done (timings never overlap them): one Ray task per compiled
   candidate, on the node that compiled it (its build is in that node's kernel cache), runs it with
   the target's bench (:func:`measure_candidate`) and sends back its result and fastest sample. A CPU
   task holds every CPU of its node, so a node measures one candidate at a time on all its cores (Ray
   sets ``OMP_NUM_THREADS`` to the CPUs a task holds); a GPU task holds one GPU.
3. Here: every result is checked against the default schedule's, as local measuring does, and the
   fastest candidate that agrees is chosen.

The progress bar advances as answers arrive (``ray.wait``). Ray is imported only when asked for.
"""

from __future__ import annotations

import collections
import logging
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from ..errors import AutotuneError
from .measure import _choose, _Reference, bench_for, measure_candidate
from .progress import _Progress
from .space import _Plan
from .workers import WORKER_START_TIMEOUT_S, _compile_jobs, _compile_with, _one_line, compile_candidate

#: How to get Ray, for the error raised without it.
INSTALL_HINT = "pip install 'tessera[ray]' (in a checkout: pip install -e '.[ray]')"
#: Seconds the task that kills a timed-out actor's process group may take to start and run on its node.
REAP_TIMEOUT_S = 60.0


def import_ray(where: str):
    """The ``ray`` module, or an :class:`AutotuneError` that says how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise AutotuneError(f"{where}: executor='ray' needs Ray, which is not installed: {INSTALL_HINT}") from exc
    return ray


def check_options(workers: int | None, where: str):
    """Ray installed and ``workers`` valid, before anything is sent. Returns the ``ray`` module."""
    ray = import_ray(where)
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise AutotuneError(
            f"{where}: workers is {workers!r}; with executor='ray' expected an int >= 1 (the Ray actors that "
            "compile; None: one per CPU of the cluster, or per GPU on GPU targets)"
        )
    return ray


def cannot_measure(config) -> str | None:
    """Why Ray workers cannot time ``config``'s kernels, as far as this process can tell (a GPU is
    looked for by the workers themselves); None when they may."""
    bench = bench_for(config)
    if bench is None:
        return f"no bench times {config.codegen_kind} kernels"
    return None if bench.on_gpu else bench.available(config)


@contextmanager
def _session(ray, address: str | None, num_cpus: int) -> Iterator[None]:
    """Ray for one search: the Ray this process has joined already, else the cluster at ``address``,
    else a local one with ``num_cpus`` CPUs. What this call starts it shuts down, what it joins it leaves."""
    if ray.is_initialized():
        yield
        return
    # Worker output stays in Ray's log files: the bar and the summary are the search's output.
    quiet = {"log_to_driver": False, "logging_level": logging.WARNING}
    if address is None:  # "local": a new Ray, even where `ray start` left one for ray.init() to find
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, **quiet)
    else:
        ray.init(address=address, **quiet)
    try:
        yield
    finally:
        ray.shutdown()


def _worker_env() -> dict[str, str]:
    """This process's Tessera settings, for the Ray workers: a Ray started earlier (or on another
    machine) has another environment; the kernel cache the search uses matters most."""
    env = {k: v for k, v in os.environ.items() if k.startswith("TESSERA_")}
    env.setdefault("TESSERA_DISABLE_CACHE", "")  # unset here: not disabled there either
    return env


class _CompileActor:
    """A compile worker on Ray: imports the compiler once, then compiles one candidate per call."""

    def __init__(self):
        from .. import compiler  # noqa: F401  (imported before ready: the compile limit counts compiles)

        try:  # a process group of its own, killed whole past the compile limit
            os.setpgid(0, 0)
        except OSError:
            pass

    def ready(self) -> tuple[str, int | None]:
        """(its node, its process group; None when it could not lead one, so only Ray may kill it)."""
        import ray

        group = os.getpgid(0)
        return ray.get_runtime_context().get_node_id(), group if group == os.getpid() else None

    def compile(self, job: Mapping[str, Any]) -> dict[str, Any]:
        return compile_candidate(job)


def _kill_group(group: int) -> None:
    """Run on a timed-out actor's node: the actor, its process group and every compiler below it
    (run_tool starts them in process groups of their own)."""
    from tessera_tvm.target.toolchain import kill_process_tree

    kill_process_tree(group)


def _on_node(node: str) -> dict[str, Any]:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node, soft=False)}


class _Slot:
    """One actor of a :class:`RayPool` and where it runs (known once it is ready)."""

    def __init__(self, actor):
        self.actor = actor
        self.node: str | None = None
        self.group: int | None = None


class RayPool:
    """``workers`` Ray actors that compile one job at a time: :class:`WorkerPool`'s ``run`` on Ray. A job
    whose actor dies fails alone; past ``timeout`` seconds (None: no limit) the actor's process group
    is killed with the compilers in it, and a fresh actor takes the slot's next job. Answers carry the
    ``node`` that compiled them (where the build is)."""

    def __init__(self, ray, workers: int, env: Mapping[str, str], timeout: float | None, gpu: bool):
        self.ray = ray
        self.workers = workers
        self.timeout = timeout
        self.actor_type = ray.remote(_CompileActor).options(
            num_cpus=1, num_gpus=1 if gpu else 0, max_restarts=0, runtime_env={"env_vars": dict(env)}
        )
        self.reaper = ray.remote(_kill_group)

    def run(self, jobs: list[tuple[Any, dict]], done: Callable[[Any, dict], None]) -> None:
        """Compile every ``(tag, job)``; ``done(tag, answer)`` is called here as each answer arrives."""
        ray = self.ray
        todo = collections.deque(jobs)
        slots: list[_Slot | None] = [None] * self.workers
        # in flight: ObjectRef -> (slot, the (tag, job) it compiles or None for the ready call, deadline)
        waiting: dict[Any, tuple[int, tuple | None, float]] = {}

        def start(i: int) -> None:
            slots[i] = _Slot(self.actor_type.remote())
            waiting[slots[i].actor.ready.remote()] = (i, None, time.monotonic() + WORKER_START_TIMEOUT_S)

        def feed(i: int) -> None:
            if todo:
                item = todo.popleft()
                deadline = time.monotonic() + (self.timeout if self.timeout is not None else math.inf)
                waiting[slots[i].actor.compile.remote(item[1])] = (i, item, deadline)

        def replace(i: int, kill: bool) -> None:
            """Slot ``i``'s actor gone (killed here first when ``kill``); a fresh one if jobs are left."""
            if kill:
                self._kill(slots[i])
            slots[i] = None
            if todo:
                start(i)

        def fail_next(error: str) -> None:  # an actor that cannot start fails the job it would have taken
            if todo:
                tag, _ = todo.popleft()
                done(tag, {"ok": False, "error": error})

        try:
            for i in range(min(self.workers, len(todo))):
                start(i)
            while waiting and (todo or any(item is not None for _, item, _ in waiting.values())):
                nearest = min(deadline for _, _, deadline in waiting.values())
                wait_s = None if nearest == math.inf else max(0.0, nearest - time.monotonic())
                refs = list(waiting)
                ready, _ = ray.wait(refs, num_returns=1, timeout=wait_s)
                if ready:  # and every other answer that is in by now
                    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
                for ref in ready:
                    i, item, _ = waiting.pop(ref)
                    try:
                        value = ray.get(ref)
                    except Exception as exc:  # the actor died (or its call could not run): a fresh one
                        slots[i].group = None  # a dead leader's group id may be reused: Ray alone kills it
                        if item is None:
                            fail_next(f"the Ray compile worker died starting: {_one_line(exc)}")
                        else:
                            done(item[0], {"ok": False, "error": f"the Ray compile worker died: {_one_line(exc)}"})
                        replace(i, kill=True)
                        continue
                    if item is None:
                        slots[i].node, slots[i].group = value
                    else:
                        done(item[0], {**value, "node": slots[i].node})
                    feed(i)
                now = time.monotonic()
                for ref, (i, item, deadline) in list(waiting.items()):
                    if deadline > now:
                        continue
                    del waiting[ref]
                    if item is None:
                        fail_next(f"the Ray compile worker did not start in {WORKER_START_TIMEOUT_S:g} s")
                        replace(i, kill=True)
                    else:
                        replace(i, kill=True)  # before done(): its compilers stop first
                        error = f"compile exceeded {self.timeout:g} s (its worker was killed)"
                        done(item[0], {"ok": False, "error": error, "seconds": self.timeout})
        finally:  # done or interrupted: no actor outlives the search
            compiling = {i for i, item, _ in waiting.values() if item is not None}
            for i, slot in enumerate(slots):
                if i in compiling:
                    self._kill(slot)
                elif slot is not None:  # idle or starting: it exits cleanly (a killed one is logged as a crash)
                    slot.actor.__ray_terminate__.remote()

    def _kill(self, slot: _Slot) -> None:
        """The actor of ``slot`` and, where it leads a process group, the compilers it started."""
        if slot.group is not None:
            reap = self.reaper.options(num_cpus=0, max_retries=0, **_on_node(slot.node)).remote(slot.group)
            try:
                self.ray.get(reap, timeout=REAP_TIMEOUT_S)
            except Exception:  # the node is gone, or the task did not run: Ray kills the actor below
                pass
        self.ray.kill(slot.actor)


def _measure(ray, plans: list[_Plan], config, repeats: int, gpu: bool, show: _Progress) -> None:
    """Every compiled candidate run and timed by a Ray task on the node that compiled it; the results
    checked here against the default schedule's and the best of each plan chosen."""
    cpus = {n["NodeID"]: n["Resources"].get("CPU", 1.0) for n in ray.nodes() if n["Alive"]}
    task = ray.remote(measure_candidate)
    env = {"env_vars": _worker_env()}
    tags: dict[Any, tuple[int, int]] = {}
    for p, plan in enumerate(plans):
        for c in plan.live:
            compiled = plan.compiled.get(c.index, {})
            if compiled.get("ok"):
                node = compiled["node"]
                held = {"num_cpus": 1, "num_gpus": 1} if gpu else {"num_cpus": cpus.get(node, 1.0)}
                options = {**held, **_on_node(node), "max_retries": 0, "runtime_env": env}
                tags[task.options(**options).remote(plan.job(c, config), repeats)] = (p, c.index)
    show.start(f"autotune: measuring {len(tags)} candidates on Ray ({repeats} samples each)", len(tags))
    answers: dict[tuple[int, int], dict[str, Any]] = {}
    pending = list(tags)
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for ref in ready:
                p, index = tags[ref]
                try:
                    answers[p, index] = ray.get(ref)
                except Exception as exc:  # its worker or node died
                    answers[p, index] = {"ok": False, "error": f"the Ray measuring task failed: {_one_line(exc)}"}
                show.step(f"{plans[p].name} #{index}")
    finally:  # interrupted: nothing left queued on a cluster that outlives the search
        for ref in pending:
            ray.cancel(ref)
    show.finish()
    for p, plan in enumerate(plans):
        reference = _Reference()
        seconds: dict[int, float] = {}
        reasons: dict[int, str] = {}
        for c in plan.live:  # in index order: the default schedule's result is the reference
            answer = plan.compiled.get(c.index, {"ok": False, "error": "not compiled"})
            if answer["ok"]:
                answer = answers[p, c.index]
            if not answer["ok"]:
                reasons[c.index] = answer["error"]
                continue
            wrong = reference.check(c.index, answer["out"], answer["dtype"])
            if wrong:
                reasons[c.index] = wrong
            else:
                seconds[c.index] = answer["seconds"]
        _choose(plan, config, seconds, reasons)


def run_on_ray(
    ray,
    plans: list[_Plan],
    config,
    *,
    workers: int | None,
    timeout: float | None,
    repeats: int,
    address: str | None,
    show: _Progress,
    where: str,
) -> tuple[int, float, float]:
    """Compile and measure every live candidate of ``plans`` on Ray (``ray`` from :func:`check_options`);
    ``plan.tuning`` is set for each. (actors, compile seconds, measure seconds)."""
    gpu = bench_for(config).on_gpu
    jobs = _compile_jobs(plans, config)
    with _session(ray, address, max(os.cpu_count() or 1, workers or 1)):
        resource = "GPU" if gpu else "CPU"
        slots = int(ray.cluster_resources().get(resource, 0))
        if slots < 1:
            raise AutotuneError(
                f"{where}: the Ray cluster has no {resource} to compile and measure {config.name} kernels on"
            )
        workers = min(workers or slots, slots, len(jobs))  # more actors than slots would wait, then fail
        start = time.perf_counter()
        _compile_with(RayPool(ray, workers, _worker_env(), timeout, gpu), jobs, plans, show, f"{workers} Ray workers")
        compiled = time.perf_counter()
        _measure(ray, plans, config, repeats, gpu, show)
    return workers, compiled - start, time.perf_counter() - compiled

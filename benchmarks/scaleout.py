"""``billing bench --scale-out``: one large batch through 1, 2 and 4 processors, each processor with its
rating workers in a CPU cgroup of its own capped at a fraction of a core.

Capped, the processors and not this machine's cores are the limit, so a 2-core machine shows whether
adding processors spreads a batch: 4 processors at 0.15 cores each use 0.6 of its cores, and the
initiator, the controller and Azurite run uncapped beside them. Each processor joins its group before
Python starts (:func:`billing.demo.start_role`), so it reads the quota as its own at start and every
rating worker it starts stays inside. The groups are made under this process's own cgroup in the
hierarchy that has the cpu controller (cgroup v2 ``cpu.max``, or v1 ``cpu.cfs_quota_us``) and removed
afterwards; making them needs root. ``cap`` 0 runs the processors uncapped (no cgroup, no root), the
curve of a machine with cores enough for every processor; ``workers_per_processor`` then gives each processor
that many rating workers (``BILLING_CPU_WORKERS``), as a cap would give it by its quota.

Every run goes through :func:`benchmarks.pipeline.run_pipeline` (a fresh Azurite and SQLite each): the
curve is each processor count's median submit → complete, the speed-ups are against 1 processor, a run
is exact when its batch stored the same aggregates as every other run (digest and totals), and the work
items each processor took come from its listeners' ``processed`` counts in its state file.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from rich.console import Console
from rich.table import Table

from .pipeline import FileKind, PipelineRun, StoreKind, median_run, run_pipeline

PROCESSORS = (1, 2, 4)
DEFAULT_CAP = 0.15  # cores per processor
PERIOD_US = 100_000  # the CFS period the quota is a share of
#: Capped processors start slowly (imports, the rating workers): the time each run gives the roles to be idle.
SETTLE_SECONDS = 120.0
Version = Literal["v1", "v2"]


class CgroupUnavailable(Exception):
    """No CPU cgroup can be made here: not root, no cpu controller, or a group that may not have children."""


@dataclass(frozen=True)
class CpuHierarchy:
    """Where this process's CPU cgroup is: ``version`` and its directory (children of it are made here)."""

    version: Version
    directory: Path


@dataclass(frozen=True)
class ScaleOutReport:
    rows: int
    file: FileKind
    store: StoreKind
    cpu_cap: float | None  # cores per processor (and its rating workers); None: uncapped
    workers_per_processor: int | None  # rating workers each processor ran (None: as many as its cores)
    cgroup: str  # "v1" or "v2" with the directory the groups were made in; "none" when uncapped
    cores: int  # this machine's
    curve: dict[str, float]  # processors → the median run's submit → complete seconds
    speedups: dict[str, float]  # processors → the first count's seconds (1 processor's) / these
    exact: bool  # every run's batch stored the same aggregates, every row accepted or rejected
    totals: dict[str, dict[str, int]]  # what every run billed: currency → transactions, net, tax, total
    work_items: dict[str, int]  # processors → the batch's work items (the median run)
    items_by_processor: dict[str, list[int]]  # processors → the work items each processor took (the median run)
    runs: list[PipelineRun]
    throttled_seconds: list[list[float]]  # per run, per processor: time its cgroup's quota held it back


def cpu_hierarchy() -> CpuHierarchy:
    """This process's cgroup in the hierarchy that has the cpu controller (v1 preferred where both are
    mounted, as the cpu controller can be in only one); raises :class:`CgroupUnavailable` if none."""
    own: dict[str, str] = {}  # controllers ("" for v2) → this process's group in that hierarchy
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        own[controllers] = path
    mounts = []  # (filesystem type, super options, root, mount point)
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        tail = fields.index("-")
        mounts.append((fields[tail + 1], fields[tail + 3].split(","), fields[3], fields[4]))
    for fstype, options, root, mount in mounts:
        group = next((path for names, path in own.items() if "cpu" in names.split(",")), None)
        if fstype == "cgroup" and "cpu" in options and group is not None:
            return CpuHierarchy("v1", _inside(Path(mount), root, group))
    for fstype, _, root, mount in mounts:
        if fstype == "cgroup2" and "" in own:
            directory = _inside(Path(mount), root, own[""])
            with contextlib.suppress(OSError):
                if "cpu" in (directory / "cgroup.controllers").read_text().split():
                    return CpuHierarchy("v2", directory)
    raise CgroupUnavailable("no cgroup hierarchy with the cpu controller is mounted (/proc/self/mountinfo)")


def _inside(mount: Path, root: str, group: str) -> Path:
    """The directory of ``group`` (a path as /proc/self/cgroup names it) in a hierarchy mounted at
    ``mount`` whose root is ``root`` (not "/" where a container sees only its own part)."""
    if root != "/" and (group == root or group.startswith(root + "/")):
        group = group[len(root) :]
    return mount / group.lstrip("/")


@contextlib.contextmanager
def cpu_groups(count: int, cores: float) -> Iterator[list[Path]]:
    """``count`` new CPU cgroups, each allowing ``cores`` cores, under this process's own; removed when
    the block ends (a process still inside is moved back to this process's group first). Raises
    :class:`CgroupUnavailable`, in one line, when they cannot be made."""
    hierarchy = cpu_hierarchy()
    quota = max(1000, round(cores * PERIOD_US))  # the kernel's least quota is 1 ms
    if hierarchy.version == "v2":
        _enable_cpu(hierarchy.directory)
    groups: list[Path] = []
    try:
        for number in range(count):
            group = hierarchy.directory / f"billing-scaleout-{os.getpid()}-{number}"
            try:
                group.mkdir()
                if hierarchy.version == "v2":
                    (group / "cpu.max").write_text(f"{quota} {PERIOD_US}")
                else:
                    (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
                    (group / "cpu.cfs_quota_us").write_text(str(quota))
            except OSError as exc:
                raise CgroupUnavailable(
                    f"capping the processors' CPU needs root and a writable cgroup {hierarchy.version} cpu "
                    f"controller: cannot set up {group} ({exc.strerror or exc}); --cap 0 runs uncapped"
                ) from None
            finally:
                if group.exists():
                    groups.append(group)
        yield groups
    finally:
        for group in groups:
            _remove(group, hierarchy.directory)


def _enable_cpu(directory: Path) -> None:
    """Let the children of a v2 group have the cpu controller (its ``cgroup.subtree_control``)."""
    control = directory / "cgroup.subtree_control"
    try:
        if "cpu" not in control.read_text().split():
            control.write_text("+cpu")
    except OSError as exc:
        reason = (
            "it has processes of its own; run from a child group"
            if exc.errno == errno.EBUSY
            else (exc.strerror or str(exc))
        )
        raise CgroupUnavailable(
            f"capping the processors' CPU needs root and cgroup v2's cpu controller for the children of "
            f"{directory}: cannot enable it ({reason}); --cap 0 runs uncapped"
        ) from None


def _remove(group: Path, parent: Path) -> None:
    """Remove a group made here, moving any process left in it to ``parent`` first."""
    for _ in range(50):
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                raise
        with contextlib.suppress(OSError):
            for pid in (group / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):  # gone meanwhile
                    (parent / "cgroup.procs").write_text(pid)
        time.sleep(0.1)
    group.rmdir()


def _throttled_seconds(group: Path) -> float:
    """How long the group's processes were held back by its quota (``cpu.stat``), in seconds."""
    stat = dict(line.split() for line in (group / "cpu.stat").read_text().splitlines() if line.strip())
    if "throttled_usec" in stat:  # v2
        return int(stat["throttled_usec"]) / 1e6
    return int(stat.get("throttled_time", 0)) / 1e9  # v1: nanoseconds


def measure(
    *,
    rows: int,
    data_dir: Path,
    console: Console,
    cap: float = DEFAULT_CAP,
    processors: tuple[int, ...] = PROCESSORS,
    repeat: int = 1,
    file: FileKind,
    store: StoreKind,
    workers_per_processor: int | None = None,
) -> ScaleOutReport:
    """Run ``rows`` rows through each processor count ``repeat`` times (counts in turn), each
    processor capped at ``cap`` cores (0: uncapped) with ``workers_per_processor`` rating workers (None: its
    cores' worth)."""
    hierarchy = cpu_hierarchy() if cap else None
    if cap:
        with cpu_groups(1, cap):  # fails here, before any run, where none can be made
            pass
    runs: list[PipelineRun] = []
    throttled: list[list[float]] = []
    for attempt in range(repeat):
        for count in processors:
            what = f"{rows:,} transactions, {count} processor{'s' if count > 1 else ''}"
            with console.status(f"{what}{f', {cap:g} cores each' if cap else ''}, run {attempt + 1} of {repeat}"):
                run_, held = _run(
                    rows, count, cap, workers_per_processor, data_dir=data_dir, console=console, file=file, store=store
                )
            runs.append(run_)
            throttled.append(held)
            console.print(
                f"{what}: {run_.submit_to_complete_seconds:.2f} s, work items per processor {run_.items_by_processor}"
            )
    medians = {count: median_run([r for r in runs if r.processors == count]) for count in processors}
    base = medians[processors[0]].submit_to_complete_seconds
    first = runs[0]
    return ScaleOutReport(
        rows=rows,
        file=file,
        store=store,
        cpu_cap=cap or None,
        workers_per_processor=workers_per_processor,
        cgroup=f"{hierarchy.version} {hierarchy.directory}" if hierarchy else "none",
        cores=os.cpu_count() or 1,
        curve={str(n): r.submit_to_complete_seconds for n, r in medians.items()},
        speedups={str(n): round(base / r.submit_to_complete_seconds, 2) for n, r in medians.items()},
        exact=all(
            r.aggregates_sha256 == first.aggregates_sha256
            and r.totals == first.totals
            and r.accepted + r.rejected == r.rows
            for r in runs
        ),
        totals=first.totals,
        work_items={str(n): r.work_items for n, r in medians.items()},
        items_by_processor={str(n): r.items_by_processor for n, r in medians.items()},
        runs=runs,
        throttled_seconds=throttled,
    )


def _run(
    rows: int,
    count: int,
    cap: float,
    workers: int | None,
    *,
    data_dir: Path,
    console: Console,
    file: FileKind,
    store: StoreKind,
) -> tuple[PipelineRun, list[float]]:
    """One run with ``count`` processors, each in a group of its own capped at ``cap`` cores (0: none) with
    ``workers`` rating workers (None: as its cores allow), and how long each group's quota held its processor back."""
    overrides = {} if workers is None else {"cpu_workers": workers}
    if not cap:
        run_ = run_pipeline(
            rows, data_dir=data_dir, console=console, processors=count, file=file, store=store, overrides=overrides
        )
        return run_, []
    with cpu_groups(count, cap) as groups:
        run_ = run_pipeline(
            rows,
            data_dir=data_dir,
            console=console,
            processors=count,
            file=file,
            store=store,
            processor_cgroups=groups,
            cpu_cap=cap,
            settle_seconds=SETTLE_SECONDS,
            overrides=overrides,
        )
        return run_, [round(_throttled_seconds(group), 2) for group in groups]


def run(
    *,
    rows: int,
    data_dir: Path,
    output: Path,
    console: Console,
    cap: float = DEFAULT_CAP,
    processors: tuple[int, ...] = PROCESSORS,
    repeat: int = 1,
    file: FileKind,
    store: StoreKind,
    workers_per_processor: int | None = None,
) -> ScaleOutReport:
    """Measure, print the curve, write ``output`` (JSON) and its chart (PNG beside it)."""
    started = time.monotonic()
    report = measure(
        rows=rows,
        data_dir=data_dir,
        console=console,
        cap=cap,
        processors=processors,
        repeat=repeat,
        file=file,
        store=store,
        workers_per_processor=workers_per_processor,
    )
    console.print(_table(report))
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(asdict(report), indent=2))
    chart = output.with_suffix(".png")
    _chart(report, chart)
    console.print(f"wrote {output} and {chart} in {time.monotonic() - started:.0f} s")
    return report


def _table(report: ScaleOutReport) -> Table:
    capped = f"each capped at {report.cpu_cap:g} cores" if report.cpu_cap else "uncapped"
    if report.workers_per_processor:
        capped += f", {report.workers_per_processor} rating workers each"
    table = Table(
        title=f"Scale-out: {report.rows:,} transactions ({report.file} file, Azurite {report.store}), "
        f"processors {capped}, {report.cores} cores here"
    )
    first = next(iter(report.curve))
    for column in (
        "processors",
        "submit → complete s",
        f"speed-up vs {first}",
        "work items each processor took",
        "load (1 min)",
    ):
        table.add_column(column, justify="right")
    for count, seconds in report.curve.items():
        median = next(r for r in report.runs if str(r.processors) == count and r.submit_to_complete_seconds == seconds)
        items = report.items_by_processor[count]
        table.add_row(
            count,
            f"{seconds:.2f}",
            f"{report.speedups[count]:.2f}×",
            f"{', '.join(map(str, items))} (of {report.work_items[count]})",
            f"{median.load_average[0]:.1f}",
        )
    table.caption = (
        "exact: every run stored the same aggregates"
        if report.exact
        else "NOT EXACT: the runs stored different aggregates (see runs[].totals in the JSON)"
    )
    return table


def _chart(report: ScaleOutReport, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = [int(n) for n in report.curve]
    seconds = list(report.curve.values())
    figure, axes = plt.subplots(figsize=(6, 4))
    axes.plot(counts, seconds, marker="o", label="measured")
    one = seconds[0] * counts[0]
    axes.plot(counts, [one / n for n in counts], linestyle="--", color="grey", label="linear")
    for n, s in zip(counts, seconds, strict=True):
        axes.annotate(f"{s:.1f} s", (n, s), textcoords="offset points", xytext=(5, 5))
    axes.set_xticks(counts)
    axes.set_xlabel("processors")
    axes.set_ylabel("submit → complete s")
    capped = f"{report.cpu_cap:g} cores each" if report.cpu_cap else "uncapped"
    axes.set_title(f"{report.rows:,} transactions, processors {capped}")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)

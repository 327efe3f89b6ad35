"""``parley cron add|list|remove|run``: scheduled jobs from the command line.

Runs beside a live gateway: both open the same SQLite database and the gateway picks up a
change within ``cron.poll_interval``, without a restart. Times are shown in each job's timezone.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

import typer
from rich.table import Table

from gateway.cli_common import ConfigOpt, err, fail, load, out, run_sync

# gateway.cli imports this module to register it: the rest is imported when a command runs.
WIDE_TABLE = 120
"""Terminal columns from which ``cron list`` prints one table row per job."""

cron_app = typer.Typer(help="Scheduled reminders and tasks.", no_args_is_help=True)


def _jobs(store: Any, config: Any) -> Any:
    from gateway.kernel.clock import SystemClock
    from gateway.kernel.cron_jobs import CronJobs

    return CronJobs(store, clock=SystemClock(), timezone=config.cron_timezone,
                    min_interval=config.cron.min_interval)


async def _open(config: Any, fn: Any) -> Any:
    """Like ``cli._with_store``, but creates the database: jobs may come before the gateway."""
    from gateway.kernel.store import Store

    store = await Store.open(config.store_target)
    try:
        jobs = _jobs(store, config)
        await jobs.ensure()
        return await fn(jobs)
    finally:
        await store.close()


def _local(when: datetime | None, tz: str) -> str:
    from gateway.kernel.schedule import zone

    return f"{when.astimezone(zone(tz)):%Y-%m-%d %H:%M:%S %Z}" if when else "-"


@cron_app.command("add")
def cron_add(
    name: Annotated[str, typer.Option("--name", help="A short name for the job.")],
    message: Annotated[str, typer.Option("--message", "-m",
                                         help="Reminder text, or the task's instruction.")],
    at: Annotated[str | None, typer.Option(
        "--at", help="Once: ISO time (naive: in --tz or cron.timezone), or a delay like 20m.")]
    = None,
    every: Annotated[str | None, typer.Option("--every", help="Repeat: 90s, 30m, 2h, 1d.")]
    = None,
    cron: Annotated[str | None, typer.Option("--cron", help="Repeat: a cron expression, "
                                                            "e.g. '0 9 * * 1-5'.")] = None,
    tz: Annotated[str | None, typer.Option("--tz", help="IANA timezone for --at and --cron.")]
    = None,
    kind: Annotated[str, typer.Option(
        "--kind", help="reminder: send the text as is; task: run it through the agent.")]
    = "reminder",
    channel: Annotated[str | None, typer.Option("--channel", help="Target channel.")] = None,
    to: Annotated[str | None, typer.Option("--to", help="Target chat id.")] = None,
    thread: Annotated[str | None, typer.Option(
        "--thread", help="A Telegram topic or Discord thread id in that chat.")] = None,
    config_path: ConfigOpt = None,
) -> None:
    """Add a job; it runs in the gateway (a running one picks it up without a restart)."""
    from gateway.kernel.cron_jobs import NewJob
    from gateway.kernel.schedule import ScheduleError

    config = load(config_path)
    given = [(k, v) for k, v in (("at", at), ("every", every), ("cron", cron)) if v]
    if len(given) != 1:
        raise fail("give exactly one of --at, --every or --cron")
    if kind not in ("reminder", "task"):
        raise fail(f"--kind {kind!r}: reminder or task")
    if not channel or not to:
        raise fail("give the target chat: --channel CHANNEL --to CHAT_ID "
                    "(e.g. --channel telegram --to 123456789)")
    section = getattr(config.channels, channel, None)
    if section is None or not getattr(section, "enabled", False):
        err.print(f"warning: channel {channel!r} is not enabled in {config.source}; the job's "
                  "deliveries will fail until it is", highlight=False, markup=False)
    if not config.cron.enabled:
        err.print("warning: cron.enabled is false; the gateway will not run this job",
                  highlight=False, markup=False)
    (schedule_kind, spec), = given
    new = NewJob(name=name, message=message, schedule_kind=schedule_kind, schedule=spec,
                 channel=channel, chat_id=to, kind=kind,  # type: ignore[arg-type]
                 tz=tz, created_by="cli", thread_id=thread or None)

    async def fn(jobs: Any) -> Any:
        return await jobs.add(new)

    try:
        job = run_sync(_open(config, fn))
    except ScheduleError as exc:
        raise fail(str(exc)) from None
    out.print(f"added {job.kind} {job.id} ({job.name}): {job.schedule.describe()}, next run "
              f"{_local(job.next_run, job.schedule.tz)} → {job.target}", highlight=False)


@cron_app.command("list")
def cron_list(config_path: ConfigOpt = None) -> None:
    """Jobs with their next run, last run and delivery status."""

    config = load(config_path)

    async def fn(jobs: Any) -> Any:
        return await jobs.jobs()

    found = run_sync(_open(config, fn))
    if not found:
        out.print("no scheduled jobs", highlight=False)
        return
    rows = []
    for job in found:
        tz = job.schedule.tz
        last = job.last
        status = last.status if last else "-"
        if last is not None and last.detail and status in ("missed", "failed"):
            status = f"{status}: {last.detail}"
        rows.append((job.id, job.name, job.kind, job.schedule.describe(), job.target,
                     _local(job.next_run, tz) if job.enabled else "done",
                     _local(last.run_at, tz) if last else "-", status,
                     last.delivery if last else "-"))
    if out.width >= WIDE_TABLE:
        table = Table("id", "name", "kind", "schedule", "target", "next run", "last run",
                      "status", "delivery")
        table.columns[0].no_wrap = True  # the id is what `remove` and `run` take
        for row in rows:
            table.add_row(*row)
        out.print(table)
        return
    # A narrow terminal: nine columns would wrap every cell; one block per job reads better.
    for i, (job_id, name, kind, schedule, target, next_run, last_run, status, delivery) in \
            enumerate(rows):
        if i:
            out.print()
        out.print(f"{job_id}  {name}  ({kind} → {target})", highlight=False, markup=False)
        out.print(f"  schedule  {schedule}", highlight=False, markup=False)
        out.print(f"  next run  {next_run}", highlight=False, markup=False)
        out.print(f"  last run  {last_run}  status {status}  delivery {delivery}",
                  highlight=False, markup=False)


@cron_app.command("remove")
def cron_remove(job_id: Annotated[str, typer.Argument(help="The job's id (see `list`).")],
                config_path: ConfigOpt = None) -> None:
    """Delete a job and its run history."""

    config = load(config_path)

    async def fn(jobs: Any) -> Any:
        return await jobs.remove(job_id)

    if not run_sync(_open(config, fn)):
        raise fail(f"no job {job_id!r} (see `parley cron list`)")
    out.print(f"removed {job_id}", highlight=False)


@cron_app.command("run")
def cron_run(job_id: Annotated[str, typer.Argument(help="The job's id (see `list`).")],
             config_path: ConfigOpt = None) -> None:
    """Run a job once now, beside its schedule (the running gateway does it)."""

    config = load(config_path)

    async def fn(jobs: Any) -> Any:
        return await jobs.request_run(job_id)

    if not run_sync(_open(config, fn)):
        raise fail(f"no job {job_id!r} (see `parley cron list`)")
    out.print(f"run of {job_id} requested: the gateway runs it within "
              f"{config.cron.poll_interval:g}s (or when it next starts)", highlight=False)

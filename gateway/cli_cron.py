"""``parley cron add|list|remove|run``: scheduled jobs from the command line.

Runs beside a live gateway: both open the same SQLite database and the gateway picks up a
change within ``cron.poll_interval``, without a restart. Times are shown in each job's timezone.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.table import Table

from gateway.cli_common import (
    ConfigOpt,
    add_row,
    err,
    fail,
    load,
    open_store,
    out,
    run_sync,
    say,
)

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
    store = await open_store(config)
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
        "--at", help="Once: 09:00 (the next one), an ISO time (naive: in --tz or "
                     "cron.timezone), or a delay like 20m or 1h30m.")]
    = None,
    every: Annotated[str | None, typer.Option("--every", help="Repeat: 90s, 30m, 1h30m, 1d.")]
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
    known = sorted(n for n, section in config.channels if hasattr(section, "enabled"))
    if channel not in known:
        raise fail(f"--channel {channel!r} is not a channel; one of {', '.join(known)}")
    if not getattr(config.channels, channel).enabled:
        say(f"warning: channel {channel!r} is not enabled in {config.source}; the job's "
            "deliveries will fail until it is", err)
    if not config.cron.enabled:
        say("warning: cron.enabled is false; the gateway will not run this job", err)
    (schedule_kind, spec), = given
    new = NewJob(name=name, message=message, schedule_kind=schedule_kind, schedule=spec,
                 channel=channel, chat_id=to, kind=kind,  # type: ignore[arg-type]
                 tz=tz, created_by="cli", thread_id=thread or None)

    async def fn(jobs: Any) -> tuple[bool, Any]:
        for job in await jobs.jobs():
            if _same(job, new, tz or config.cron_timezone, config.cron.min_interval):
                return False, job
        return True, await jobs.add(new)

    try:
        added, job = run_sync(_open(config, fn), config)
    except ScheduleError as exc:
        raise fail(str(exc)) from None
    said = "added" if added else "already scheduled (nothing added):"
    say(f"{said} {job.kind} {job.id} ({job.name}): {job.schedule.describe()}, next run "
        f"{_local(job.next_run, job.schedule.tz)} → {job.target}")


def _same(job: Any, new: Any, tz: str, min_interval: float) -> bool:
    """``new`` is ``job`` again (a retried command): same text, target and schedule."""
    from gateway.kernel.schedule import Schedule

    if not job.enabled or (job.name, job.message, job.kind, job.channel, job.chat_id,
                           job.thread_id) != (new.name.strip(), new.message, new.kind,
                                              new.channel, new.chat_id, new.thread_id):
        return False
    wanted = Schedule.parse(new.schedule_kind, new.schedule, tz=tz, now=datetime.now(UTC),
                            min_interval=min_interval)
    return (job.schedule.kind, job.schedule.spec, job.schedule.tz) == \
        (wanted.kind, wanted.spec, wanted.tz)


@cron_app.command("list")
def cron_list(config_path: ConfigOpt = None) -> None:
    """Jobs with their next run, last run and delivery status."""

    config = load(config_path)

    async def fn(jobs: Any) -> Any:
        return await jobs.jobs()

    found = run_sync(_open(config, fn))
    if not found:
        say("no scheduled jobs")
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
            add_row(table, *row)
        out.print(table)
        return
    # A narrow terminal: nine columns would wrap every cell; one block per job reads better.
    for i, (job_id, name, kind, schedule, target, next_run, last_run, status, delivery) in \
            enumerate(rows):
        if i:
            out.print()
        say(f"{job_id}  {name}  ({kind} → {target})")
        say(f"  schedule  {schedule}")
        say(f"  next run  {next_run}")
        say(f"  last run  {last_run}  status {status}  delivery {delivery}")


@cron_app.command("remove")
def cron_remove(job_id: Annotated[str, typer.Argument(help="The job's id (see `list`).")],
                config_path: ConfigOpt = None) -> None:
    """Delete a job and its run history."""

    config = load(config_path)

    async def fn(jobs: Any) -> Any:
        return await jobs.remove(job_id)

    if not run_sync(_open(config, fn)):
        raise fail(f"no job {job_id!r} (see `parley cron list`)")
    say(f"removed {job_id}")


@cron_app.command("run")
def cron_run(job_id: Annotated[str, typer.Argument(help="The job's id (see `list`).")],
             config_path: ConfigOpt = None) -> None:
    """Run a job once now, beside its schedule (the running gateway does it)."""

    config = load(config_path)

    async def fn(jobs: Any) -> Any:
        return await jobs.request_run(job_id)

    if not run_sync(_open(config, fn)):
        raise fail(f"no job {job_id!r} (see `parley cron list`)")
    say(f"run of {job_id} requested: the gateway runs it within "
        f"{config.cron.poll_interval:g}s (or when it next starts)")

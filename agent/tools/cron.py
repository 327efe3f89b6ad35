"""The cron tool: the agent schedules reminders and tasks for the chat it is talking in.

The target is always the turn's chat (a scheduled turn's target chat), read from the
TurnContext; the model has no way to name another chat, and can list and remove only this
chat's jobs.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from agent.tools.base import ToolError, ToolRetry, tool
from agent.turn import CronService, TurnContext
from gateway.kernel.cron_jobs import CronJob, NewJob
from gateway.kernel.schedule import ScheduleError, zone


def _service(ctx: TurnContext) -> tuple[CronService, tuple[str, str]]:
    service = ctx.services.cron
    if service is None:
        raise ToolError("scheduled jobs are not available here (they run in `parley gateway` "
                        "with cron enabled)")
    target = ctx.reply_target
    if target is None:
        raise ToolError("this turn has no chat to schedule jobs for")
    return service, target


def _local(when: datetime | None, tz: str) -> str:
    return f"{when.astimezone(zone(tz)):%Y-%m-%d %H:%M} {tz}" if when else "never"


def _line(job: CronJob) -> str:
    tz = job.schedule.tz
    state = f"next {_local(job.next_run, tz)}" if job.enabled else "done"
    last = ""
    if job.last is not None:
        last = (f"; last run {_local(job.last.run_at, tz)}: {job.last.status}, delivery "
                f"{job.last.delivery}")
    return (f"- {job.id} [{job.kind}] {job.name!r}: {job.schedule.describe()}; {state}{last}; "
            f"message: {job.message[:200]!r}")


@tool(name="cron", group="cron")
async def cron(ctx: TurnContext, action: Literal["add", "list", "remove"], message: str = "",
               at: str | None = None, every: str | None = None, cron_expr: str | None = None,
               tz: str | None = None, kind: Literal["reminder", "task"] = "reminder",
               name: str = "", job_id: str | None = None) -> str:
    """Schedule jobs for this chat, list them, or remove one. A reminder sends `message` to
    this chat word for word at its time (no AI involved). A task gives you `message` as an
    instruction at its time, in a separate session, and sends your answer to this chat.
    Give exactly one of at, every or cron_expr when adding.

    Args:
        action: add, list (this chat's jobs) or remove (one of this chat's jobs, by job_id).
        message: add: the reminder text, or the task instruction.
        at: add, once: an ISO time such as 2025-06-01T09:00 (read in tz), or a delay like 20m.
        every: add, repeating: an interval such as 30m, 2h or 1d.
        cron_expr: add, repeating: a cron expression such as '0 9 * * 1-5', evaluated in tz.
        tz: IANA timezone for at and cron_expr, e.g. Europe/Berlin (default: the gateway's).
        kind: add: reminder (send the text) or task (run the instruction through you).
        name: add: a short name for the job.
        job_id: remove: the job's id, as list shows it.
    """
    service, (channel, chat_id) = _service(ctx)
    if action == "list":
        jobs = await service.jobs(channel=channel, chat_id=chat_id)
        if not jobs:
            return "This chat has no scheduled jobs."
        return "Scheduled jobs of this chat:\n" + "\n".join(_line(j) for j in jobs)
    if action == "remove":
        if not job_id:
            raise ToolRetry("give the job_id to remove (action=list shows them)")
        if not await service.remove(job_id.strip(), channel=channel, chat_id=chat_id):
            raise ToolRetry(f"this chat has no job {job_id!r} (action=list shows its jobs)")
        return f"Removed job {job_id}."
    given = [(k, v) for k, v in (("at", at), ("every", every), ("cron", cron_expr)) if v]
    if len(given) != 1:
        raise ToolRetry("give exactly one of at, every or cron_expr")
    (schedule_kind, spec), = given
    try:
        job = await service.add(NewJob(
            name=name, message=message, schedule_kind=schedule_kind, schedule=spec,
            channel=channel, chat_id=chat_id, kind=kind, tz=tz or service.timezone,
            created_by=f"agent:{ctx.session_key}", thread_id=ctx.reply_thread,
            trust=ctx.message.trust, sender_id=ctx.message.sender_id))
    except ScheduleError as exc:
        raise ToolRetry(str(exc)) from None
    return (f"Added {job.kind} {job.id} ({job.name!r}): {job.schedule.describe()}, next run "
            f"{_local(job.next_run, job.schedule.tz)}. It will be delivered to this chat.")


CRON_TOOLS = [cron]

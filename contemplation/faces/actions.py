"""What the faces (CLI, MCP server, dashboard) may change: create, start, send, respond,
approve, cancel, archive.

Each action validates its input, then writes into the conversation folder through
:mod:`contemplation.writer` only. None of them waits for the model: the daemon (if one runs)
picks the files up; without one they stay queued.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, get_args

from contemplation import backends
from contemplation.base import acting
from contemplation.base.terminal import safe
from contemplation.errors import AlreadyDecided, ContemplationError, InputRejected, LockBusy
from contemplation.faces.reading import Answered, Reader, Standing
from contemplation.models import (
    APPROVALS_KEY,
    CANCELLABLE,
    DECIDERS,
    ApprovalDecision,
    Decider,
    Decision,
    MarkerKind,
    Status,
    read_approvals,
)
from contemplation.protocol import logformat, panel, structured
from contemplation.settings import Settings
from contemplation.store import waiting
from contemplation.store.attachments import Attachment
from contemplation.store.layout import (
    Conv,
    Home,
    not_a_message,
    queued_messages,
    read_json,
    read_metadata,
    read_state,
)
from contemplation.store.templates import Template, load_template
from contemplation.store.waiting import Face
from contemplation.writer import (
    ConvWriter,
    archive,
    atomic_write_json,
    conv_lock,
    drop_message,
    ensure_home,
    faces_lock,
    idempotent_create,
    new_conversation,
    open_writer,
    request_cancel,
    unarchive,
)
from contemplation.writer.attachments import drop_folder_message

KEY_TTL = 24 * 3600.0  # a client-supplied idempotency key is remembered this long
SAME_ARGS_WINDOW = 120.0  # identical start calls within this window are one conversation
INITIAL_NAME = "0000-initial.msg"

__all__ = [
    "CANCELLABLE", "approve", "archive_conversation", "cancel", "check_message", "check_text",
    "create", "reopen", "require_active", "respond", "retract", "send", "set_model", "start",
]  # fmt: skip


def check_text(text: str, settings: Settings, what: str = "the message") -> None:
    """Refuse an empty, oversized or binary (NUL bytes) text with one line that says why,
    by the daemon's own rule (:func:`~contemplation.store.layout.not_a_message`): what it would
    refuse into failed/ is never queued."""
    if not text.strip():
        raise InputRejected(f"{what} is empty")
    data = text.encode("utf-8")
    if len(data) > settings.max_message_bytes:
        raise InputRejected(
            f"{what} is {len(data)} bytes; the limit is {settings.max_message_bytes} "
            "(max_message_bytes)"
        )
    why = not_a_message(data, what)
    if why is not None:
        raise InputRejected(why)


def check_message(text: str, settings: Settings, what: str = "the message") -> None:
    """:func:`check_text`, and for a message (whose first line is its own) the daemon's rule
    for a ``SCHEMA:`` line (:func:`structured.refused`): one line, nothing queued."""
    check_text(text, settings, what)
    why = structured.refused(text, settings.max_schema_bytes)
    if why is not None:
        raise InputRejected(why)


def _resolve(
    settings: Settings,
    home: Home,
    topic: str,
    *,
    model: str | None,
    backend: str | None,
    template: str | None,
) -> tuple[Template, str, str]:
    """The template, backend and model a new conversation gets (flag, template, config)."""
    if not topic.strip():
        raise InputRejected("a conversation needs a topic")
    tpl = load_template(home, template or settings.default_template)
    model_name = model or tpl.model or settings.default_model
    # a model that names an alias takes the alias's providers (unless a backend is named)
    alias = model_name if model_name in settings.aliases else None
    backend_name = backend or alias or tpl.backend or settings.default_backend
    if not backends.named(settings, backend_name):
        raise InputRejected(str(backends.unknown(settings, backend_name)))
    return tpl, backend_name, model_name


def _extra(
    reqs: list[dict[str, str]], think: bool | str | None, started_by: str | None = None
) -> dict[str, Any] | None:
    extra: dict[str, Any] = {}
    if started_by:
        extra["started_by"] = started_by  # the agent's face: `watch --agent` follows it
        if (agent := acting.session()) is not None:
            extra["started_in"] = agent  # that agent's process: its own watch tells it
    if reqs:
        extra["context_requirements"] = reqs
    if think is not None:
        extra["think"] = think  # the caller's choice wins over the template's
    return extra or None


@dataclass(frozen=True, slots=True)
class PanelAsk:
    """A panel asked for (``new --model a --model b``, MCP ``models``, a template's
    ``models``): every message answered by each model; ``debate``: each also sees the others'
    answers of the round before; ``synthesize``: one more reply that weighs them."""

    models: tuple[str, ...] = ()
    debate: bool = False
    synthesize: str | None = None

    def fields(
        self, backend_of: Callable[[str], str], agent_label: str = "CLAUDE"
    ) -> dict[str, Any]:
        """metadata.json's fields for it (none for fewer than two models and no options);
        ``backend_of``: the backend a model goes to. Raises InputRejected for a malformed
        panel."""
        if len(self.models) < 2:
            if self.debate or self.synthesize:
                raise InputRejected("--debate and --synthesize need a panel: two --model or more")
            return {}
        try:
            seats = panel.members(self.models, agent_label)
        except ValueError as exc:
            raise InputRejected(str(exc)) from None
        out: dict[str, Any] = {
            "model": seats[0].model,
            "model_label": panel.PANEL,
            "panel": [
                {"model": m.model, "label": m.label, "backend": backend_of(m.model)} for m in seats
            ],
        }
        if self.debate:
            out["debate"] = True
        if self.synthesize:
            taken = {agent_label, *(m.label for m in seats)}
            name = self.synthesize.strip()
            label = panel.label_for(f"synthesis {name}", taken)
            out["synthesize"] = {"model": name, "label": label, "backend": backend_of(name)}
        return out


def create(
    settings: Settings,
    topic: str,
    *,
    model: str | None = None,
    backend: str | None = None,
    template: str | None = None,
    think: bool | str | None = None,
    started_by: str | None = None,
    ask: PanelAsk = PanelAsk(),
) -> Conv:
    """A new conversation with nothing queued (``contemplation new`` without a message);
    ``ask``: a panel of models."""
    home = Home(settings.home)
    ensure_home(home)
    tpl, backend_name, model_name = _resolve(
        settings, home, topic, model=model, backend=backend, template=template
    )
    seats = _panel_of(ask, tpl, settings, backend)
    return new_conversation(
        home,
        topic,
        template=tpl,
        model=model_name,
        backend=backend_name,
        extra=(_extra([], think, started_by) or {}) | seats or None,
        durable=settings.durability == "fsync",
    )


def _panel_of(
    ask: PanelAsk, tpl: Template, settings: Settings, backend: str | None
) -> dict[str, Any]:
    """The panel's metadata fields: the caller's models, else the template's ``models``,
    each going where a conversation of its own would (the named backend, its alias's
    providers, the template's backend, the configured one)."""
    if not ask.models and tpl.models:
        ask = PanelAsk(tuple(tpl.models), ask.debate, ask.synthesize)

    def backend_of(model: str) -> str:
        alias = model if model in settings.aliases else None
        name = backend or alias or tpl.backend or settings.default_backend
        if not backends.named(settings, name):
            raise InputRejected(str(backends.unknown(settings, name)))
        return name

    return ask.fields(backend_of)


def start(
    settings: Settings,
    topic: str,
    initial_prompt: str | None,
    *,
    model: str | None = None,
    backend: str | None = None,
    template: str | None = None,
    context_requirements: list[str] | None = None,
    idempotency_key: str | None = None,
    think: bool | str | None = None,
    files: Sequence[Attachment] = (),
    started_by: str | None = None,
    ask: PanelAsk = PanelAsk(),
) -> tuple[Conv, bool]:
    """A new conversation with its first message queued (none when ``initial_prompt`` is None:
    it starts empty), carrying ``files``; ``ask``: a panel of models. Returns it and whether
    it is new."""
    home = Home(settings.home)
    ensure_home(home)
    tpl, backend_name, model_name = _resolve(
        settings, home, topic, model=model, backend=backend, template=template
    )
    if initial_prompt is not None:
        check_message(initial_prompt, settings, "the initial prompt")
    seats = _panel_of(ask, tpl, settings, backend)  # before anything is created
    reqs = [{"type": "need", "need": r} for r in (context_requirements or []) if r.strip()]
    if idempotency_key:
        key, ttl = "key:" + idempotency_key, KEY_TTL
    else:
        args: list[Any] = [topic, initial_prompt, model_name, backend_name, tpl.name, reqs, think]
        args += [seats] if seats else []
        args += [a.sha256 for a in files]
        digest = hashlib.sha256(json.dumps(args, ensure_ascii=False).encode()).hexdigest()
        key, ttl = "args:" + digest, SAME_ARGS_WINDOW

    def first(conv: Conv) -> None:  # in the conversation before it appears
        if files:
            drop_folder_message(conv, initial_prompt or "", files, name=INITIAL_NAME)
        elif initial_prompt is not None:
            drop_message(conv, initial_prompt, name=INITIAL_NAME)

    def make(name: str) -> Conv:
        return new_conversation(
            home,
            topic,
            template=tpl,
            model=model_name,
            backend=backend_name,
            extra=(_extra(reqs, think, started_by) or {}) | seats or None,
            durable=settings.durability == "fsync",
            name=name,
            first=first,
        )

    return idempotent_create(home, key, ttl, make, topic)


def send(settings: Settings, conv: Conv, text: str, files: Sequence[Attachment] = ()) -> str:
    """Queue a plain message (with ``files``: a folder message, its text may be empty);
    returns the inbox name."""
    require_active(conv)
    if files:
        if text.strip():
            check_message(text, settings)
        return drop_folder_message(conv, text, files).name
    check_message(text, settings)
    return drop_message(conv, text).name


def respond(
    settings: Settings,
    reader: Reader,
    conv: Conv,
    text: str,
    need: str | None = None,
    *,
    face: Face = "cli",
    plain: bool = False,
    since: int | None = None,
    files: Sequence[Attachment] = (),
) -> dict[str, Any]:
    """Answer a need the model waits for (a RESPONSE TO NEED block), else send a plain message.
    One answer is one turn: with no need waiting but one answered since the agent's last
    message (another responder came first, and the model may have replied already), nothing
    is sent and the refusal names that answer, by whom and when; under the faces' lock,
    across processes.

    ``need`` names the need: its id (or a unique prefix), or its text; it may be left out when
    exactly one need waits; ``plain`` sends ``text`` as a message whatever waits. A lookup
    waiting for approval is never answered with text: naming one, or responding while only
    lookups wait, is refused with the ``approve`` command that fits (``face``: whose words).
    Returns ``answered`` (the need, or None for a plain
    message), ``need_id``, ``queued`` (the inbox file), ``still_waiting`` (the items left)
    and ``cursor``: ``since`` (the cursor the agent holds) when given, so no block it has not
    been shown is passed over; else where this exchange's blocks begin."""
    require_active(conv)
    if text.strip() or not files:
        check_text(text, settings, "the response")
    with faces_lock(conv):  # two responders at once: the second sees the first's answer
        cursor = reader.boundary(conv) if since is None else since
        if plain:
            if need:
                raise InputRejected("a plain message answers no need: leave out need or plain")
            queued = send(settings, conv, text, files)
            done = {"answered": None, "need_id": None, "queued": queued}
            return done | {"still_waiting": [], "cursor": cursor}
        answered = _respond(settings, reader, conv, text, need, face=face, files=files)
        return answered | {"cursor": cursor}


def _respond(
    settings: Settings,
    reader: Reader,
    conv: Conv,
    text: str,
    need: str | None,
    *,
    face: Face,
    files: Sequence[Attachment] = (),
) -> dict[str, Any]:
    items = reader.waiting(conv)
    try:
        chosen = waiting.choose(conv.id, items, need, "need", face)
    except InputRejected:
        if need and (hit := _answered_already(reader, conv, need)):
            left = f"; waiting: {waiting.listed(items)}" if items else ""
            raise InputRejected(f"{conv.id}: {hit.said()}; nothing was sent{left}") from None
        raise
    if chosen is None:
        given = reader.answered(conv)
        # one answer is one turn: the need this answer was for was answered since the agent's
        # last message (another agent came first), and the model may have gone on already
        if last := given[-1] if given else reader.last_answer(conv):
            plain = "plain=true" if face == "mcp" else f"`contemplation send {conv.id} …`"
            raise InputRejected(
                f"{conv.id} waits for no answer: {last.said()}; nothing was sent. To send a new "
                f"message, use {plain}"
            )
        return {  # nothing was asked since the last message: a follow-up
            "answered": None,
            "need_id": None,
            "queued": send(settings, conv, text, files),
            "still_waiting": [],
        }
    stamp = logformat.timestamp()
    body = f"{logformat.RESPONSE_PREFIX} {chosen.need}\n(source: agent, {stamp})\n{text}"
    name = (drop_folder_message(conv, body, files) if files else drop_message(conv, body)).name
    return {
        "answered": chosen.need,
        "need_id": chosen.id,
        "queued": name,
        "still_waiting": [i.as_dict(conv.id, face) for i in items if i.id != chosen.id],
    }


def _answered_already(reader: Reader, conv: Conv, ref: str) -> Answered | None:
    """The answer given already to the need ``ref`` names (its id, a prefix, its text)."""
    ref = ref.strip()
    for a in reversed(reader.answered(conv)):
        if ref in {a.id, a.need} or (len(ref) >= waiting.MIN_PREFIX and a.id.startswith(ref)):
            return a
    return reader.last_answer(conv, ref)  # answered, and the model has gone on since


KEPT_GRANTS = 256  # "always" decisions a conversation keeps (the oldest go first)
KEPT_DECIDED = 256  # other decisions it keeps, to name them to a later one (the oldest go)
DECISIONS: tuple[str, ...] = get_args(Decision)


def agent_may_approve(settings: Settings, conv: Conv, *, forms: bool) -> None:
    """Approvals are the person's: the agent's decision (``conversation_approve``, or the CLI
    run from the agent's shell) is refused, in one line that says where the person decides,
    unless ``agent_approves`` lets it decide: ``always``, or ``without_forms`` (the default)
    when its client shows the person no forms (then the agent is the only one asked, as
    before). The line names no command to run: it is read by the agent."""
    how = settings.agent_approves
    if how == "always" or (how == "without_forms" and not forms):
        return
    where = (
        "in the form their MCP client shows them (conversation_wait puts it to them)"
        if forms
        else "outside this chat"
    )
    raise InputRejected(
        f"lookups of {conv.id} waiting for approval are the person's to decide, {where}, on "
        "the dashboard, or in their own terminal; you cannot decide them "
        f'(agent_approves = "{how}" in their config)'
    )


def approve(
    settings: Settings,
    conv: Conv,
    decision: str,
    need: str | None = None,
    *,
    reader: Reader | None = None,
    face: Decider = "cli",
    agent: str = "",
) -> dict[str, Any]:
    """The agent's decision about a lookup that waits for approval (``awaiting_approval``):
    ``once`` lets it through this time, ``always`` also lets the same tool with the same
    arguments through in this conversation from now on, ``reject`` refuses it (the model is
    told and carries on). ``need`` names the lookup (its id, a unique prefix, or its need);
    it may be left out when only one waits. A need to answer is refused with the
    ``respond`` command that fits; ``face`` is the face deciding (and whose words; ``agent``:
    which agent ran the CLI, with face ``agent-cli``).

    A decision is final: the first about a lookup wins, and a later one, through any face,
    is refused with one line naming it (what, through which face, when). The decision is
    read and written under the faces' lock (a flock), so of several racing deciders, in
    threads or processes, exactly one is told it is done. It goes into metadata.json
    ``approvals`` (written atomically): the daemon sees the file change and answers or
    refuses the need; without a daemon it is honoured when one starts. Returns
    ``decision``, ``need``, ``tool``, ``arguments``, ``request`` (the lookup's id),
    ``still_waiting`` (the items left) and ``cursor``."""
    require_active(conv)
    if decision not in DECISIONS:
        raise InputRejected(f"unknown decision {decision!r}; say once, always or reject")
    words: Face = "mcp" if face == "mcp" else "cli"  # the dashboard shows the CLI's commands
    if face == "agent-cli":
        words = "agent"  # no command to paste: the agent is told where the person decides
    reader = reader or Reader(Home(settings.home))
    with faces_lock(conv):  # one decider at a time reads the decisions and adds its own
        cursor = reader.boundary(conv)
        raw = read_json(conv.metadata)
        if raw is None:
            raise ContemplationError(f"{conv.id} has no readable metadata.json")
        given = read_approvals(raw.get(APPROVALS_KEY))
        view = reader.standing(conv, decided=True)  # a decided lookup is named, not decided
        chosen = _chosen(conv, view, given, need, words)
        request = next(
            (r for r in (view.state.pending_approvals if view.state else []) if r.id == chosen.id),
            None,
        )
        asked = request.model_dump() if request is not None else None
        first = waiting.deciding_for(chosen.id, asked, [d.model_dump() for d in given])
        if first is not None:
            said = ApprovalDecision.model_validate(first)
            raise AlreadyDecided(waiting.decided_line(chosen.id, chosen.need, said))
        made = ApprovalDecision(
            request=chosen.id,
            decision=decision,  # checked against DECISIONS above
            need=chosen.need,
            rule=request.rule if request is not None else "",
            tool=chosen.tool,
            arguments=chosen.arguments,
            time=logformat.timestamp(),
            face=face,
            agent=agent,
        )
        raw[APPROVALS_KEY] = [d.model_dump(mode="json") for d in _kept([*given, made])]
        atomic_write_json(conv.metadata, raw, durable=settings.durability == "fsync")
    return {
        "decision": decision,
        "need": chosen.need,
        "tool": chosen.tool,
        "arguments": chosen.arguments,
        "request": chosen.id,
        "still_waiting": [
            i.as_dict(conv.id, words)
            for i in view.items
            if i.id != chosen.id and i.id not in view.deciding
        ],
        "cursor": cursor,
    }


def _chosen(
    conv: Conv,
    view: Standing,
    given: list[ApprovalDecision],
    ref: str | None,
    words: Face,
) -> waiting.WaitItem:
    """The lookup a decision is about; a reference to one decided earlier that no longer
    waits (the daemon acted on it) is refused naming that decision."""
    try:
        chosen = waiting.choose(conv.id, view.items, ref, "approval", words)
    except InputRejected:
        named = _decided(given, ref) if ref else None
        if named is not None:
            raise AlreadyDecided(waiting.decided_line(named.request, named.need, named)) from None
        raise
    if chosen is None:
        now = view.state.status.value if view.state is not None else Status.PENDING.value
        line = f"{conv.id} waits for no approval (status {now})"
        if given:
            last = given[-1]
            line += (
                f"; the last decision: lookup {last.request} ({last.need}) "
                f"{waiting.VERBS[last.decision]}"
                f"{f' by {last.by}' if last.face else ''}"
                f"{f' at {last.time}' if last.time else ''}"
            )
        raise InputRejected(safe(line))
    return chosen


def _decided(given: list[ApprovalDecision], ref: str) -> ApprovalDecision | None:
    """The decision ``ref`` names: the lookup's id or its need (the latest such), else a
    prefix of one id."""
    ref = ref.strip()
    hits = [d for d in given if ref in {d.request, d.need}]
    if hits:
        return hits[-1]
    if len(ref) >= waiting.MIN_PREFIX:
        hits = [d for d in given if d.request.startswith(ref)]
    return hits[0] if len({d.request for d in hits}) == 1 else None


def _kept(decided: list[ApprovalDecision]) -> list[ApprovalDecision]:
    """The decisions a conversation keeps: the latest KEPT_GRANTS ``always`` ones (they let
    lookups through from then on) and the latest KEPT_DECIDED others."""
    grants = [d for d in decided if d.grants]
    others = [d for d in decided if not d.grants]
    dropped = {id(d) for d in grants[: max(0, len(grants) - KEPT_GRANTS)]}
    dropped |= {id(d) for d in others[: max(0, len(others) - KEPT_DECIDED)]}
    return [d for d in decided if id(d) not in dropped]


def archive_conversation(home: Home, conv: Conv) -> Conv:
    """Move to ``completed/`` unless the daemon is writing to it right now or a message is
    still queued (in completed/ it would never be answered)."""
    if conv.is_completed:
        return conv
    return _between_steps(conv, lambda: _archive_now(home, conv), "cancel it or try again shortly")


def _archive_now(home: Home, conv: Conv) -> Conv:
    with conv_lock(conv, blocking=False) as got:
        if not got:
            raise LockBusy(f"{conv.id} is busy")
        queued = len(queued_messages(conv))
        if queued:
            raise InputRejected(
                f"{conv.id} has {queued} queued message(s) that would never be answered in "
                "completed/; wait for the reply (send --wait) and archive it then"
            )
        st = read_state(conv)
        if st is not None and (st.intent is not None or st.rotation is not None):
            raise InputRejected(  # no writer holds the lock: a crash left it half done
                f"{conv.id} has a write a crash cut, which the daemon finishes (a reply is "
                "adopted or redone) and never would in completed/; start it, wait for the "
                "reply (contemplation wait) and archive it then"
            )
        return archive(home, conv)


def reopen(home: Home, conv: Conv) -> Conv:
    """Move an archived conversation back into ``active/`` to continue it: the next message
    is a turn as any other, and the COMPLETE it ended with does not archive it again."""
    if not conv.is_completed:
        raise InputRejected(f"{conv.id} is active already (not in completed/)")
    return unarchive(home, conv)


def cancel(conv: Conv) -> Status | None:
    """Ask the daemon to stop the turn in flight (or its retries), or the turn that is due
    and waits for its slot (its message taken into the log or ``processing/``: the daemon
    honours the flag there, and the turn ends cancelled without reaching the model).
    Returns the status that is being cancelled (``pending`` for a turn not begun), or None
    when no turn runs or is due: then no flag is written, so no future turn can be
    cancelled by mistake."""
    require_active(conv)
    state = read_state(conv)
    if state is not None and state.status in CANCELLABLE:
        request_cancel(conv)
        return state.status
    if not turn_due(conv):
        return None
    request_cancel(conv)
    return Status.PENDING


def turn_due(conv: Conv) -> bool:
    """A model turn is due and has not begun: a message is claimed into ``processing/``,
    or the log ends with the agent's words and no reply (the turn waits for a slot)."""
    try:
        if any(not p.name.startswith(".") for p in conv.processing.iterdir()):
            return True
    except OSError:
        pass
    return log_awaits_turn(conv)


def log_awaits_turn(conv: Conv) -> bool:
    """The log ends with the agent's words and no reply (in a panel: a seat has not answered
    yet): a turn of its last message is due."""
    from contemplation.store.logview import LogView

    blocks = LogView(conv).refresh().blocks
    return panel.next_for(read_metadata(conv), blocks)[1].action == "turn"


_T = TypeVar("_T")
LOCK_TRIES = 100  # a held lock is asked this many times, 20 ms apart (a daemon's step)


def _between_steps(conv: Conv, act: Callable[[], _T], then: str = "try again shortly") -> _T:
    """``act``, done again while it finds the conversation's lock held (:class:`LockBusy`):
    a daemon's step holds it briefly (adopting a folder, a state write), a turn for a whole
    reply, which is then said, with ``then``."""
    for _ in range(LOCK_TRIES):
        try:
            return act()
        except LockBusy:
            time.sleep(0.02)
    raise LockBusy(f"{conv.id} is busy (a reply is being written); {then}")


RETRACTED_WORDS = "the agent withdrew this turn"


def retract(settings: Settings, conv: Conv) -> dict[str, Any]:
    """Withdraw the last turn when it failed or was cancelled (an image sent to a model that
    cannot see, a runaway reply): a ``RETRACTED`` line ends the log, so the blocks from the
    agent's message that began the turn are left out of every request from then on, and no
    turn runs until the agent writes again. The log keeps them. Returns ``block`` (the
    message's number, from 1) and ``message`` (its first line). The lock is asked without
    blocking, a few times (a daemon's step holds it briefly; a turn, for a whole reply)."""
    require_active(conv)

    def act() -> dict[str, Any]:
        with open_writer(conv, durable=settings.durability == "fsync", wait=False) as w:
            return _withdraw(conv, w)

    return _between_steps(conv, act)


def _withdraw(conv: Conv, w: ConvWriter) -> dict[str, Any]:
    from contemplation.store.logview import LogView

    if w.state.intent is not None or w.state.rotation is not None:
        raise InputRejected(f"{conv.id} has a write to recover first; try again once a daemon ran")
    if w.log_size() != w.state.log.size:
        raise InputRejected(f"{conv.id} has bytes the daemon has not taken yet; try again shortly")
    blocks = LogView(conv).refresh().blocks
    if panel.next_for(w.meta, blocks)[1].action != "stopped":
        raise InputRejected(
            f"{conv.id} has no failed or cancelled turn to withdraw (status {w.state.status.value})"
        )
    n = next(
        (
            i
            for i in range(len(blocks), 0, -1)
            if blocks[i - 1].kind.value == "agent" and blocks[i - 1].response_to is None
        ),
        1,
    )
    first = blocks[n - 1].text.strip().split("\n", 1)[0] if blocks else ""
    seats = panel.stopped_seats(w.meta, blocks) if w.meta.panel else []
    if not seats:
        w.append_marker(MarkerKind.RETRACTED, RETRACTED_WORDS)
    last = blocks[-1].sender if blocks else None
    for label in seats:  # each failed seat's turn, in its own line (not another seat's reply)
        if label == last:
            w.append_marker(MarkerKind.RETRACTED, RETRACTED_WORDS)
        else:
            own = w.reply(label, w.meta.agent_label, f"retract-{w.state.log.size}")
            own.begin()
            own.abort(MarkerKind.RETRACTED, RETRACTED_WORDS)
        last = label
    w.show(Status.IDLE)
    return {"retracted": True, "block": n, "message": logformat.one_line(first, 80)}


def go_on(settings: Settings, conv: Conv, face: Decider = "cli") -> dict[str, Any]:
    """Have the model go on with its last reply (one a loop, the token limit or a person
    thought short): a ``GO ON`` line ends the log and the next turn's request ends with that
    reply as the model's own words, so the model carries on from them (a server that takes a
    last assistant message as the start of its answer, as llama-server and Ollama do, goes on
    mid-sentence). Its words come in a model block of their own; no message is written in
    the person's name. Returns ``block`` (the reply's number, from 1)."""
    require_active(conv)

    def act() -> dict[str, Any]:
        with open_writer(conv, durable=settings.durability == "fsync", wait=False) as w:
            return _go_on(conv, w, face)

    return _between_steps(conv, act)


def _go_on(conv: Conv, w: ConvWriter, face: Decider) -> dict[str, Any]:
    from contemplation.store.logview import LogView

    if w.state.intent is not None or w.state.rotation is not None:
        raise InputRejected(f"{conv.id} has a write to recover first; try again once a daemon ran")
    if w.log_size() != w.state.log.size:
        raise InputRejected(f"{conv.id} has bytes the daemon has not taken yet; try again shortly")
    blocks = LogView(conv).refresh().blocks
    _, nxt = panel.next_for(w.meta, blocks)
    if not blocks or blocks[-1].kind.value != "model" or nxt.action != "idle":
        raise InputRejected(
            f"{conv.id} has no reply to go on with: the last block is not a finished reply "
            f"of the model's (status {w.state.status.value}); send a message instead"
        )
    who = "the agent (conversation_continue)" if face == "mcp" else DECIDERS[face]
    w.append_marker(MarkerKind.GO_ON, f"asked by {who}")
    w.show(Status.PENDING)
    return {"continued": True, "block": len(blocks)}


def set_model(
    settings: Settings,
    conv: Conv,
    model: str,
    backend: str | None = None,
    *,
    seat: str | None = None,
) -> dict[str, Any]:
    """Move the conversation to ``model`` (on ``backend``, or on the alias ``model`` names,
    else on its backend as it is) from its next turn on; a turn in flight ends as it began.
    In a panel ``seat`` (a seat's label, as its replies' headers say) names the seat moved:
    it keeps its label, so its line of the log goes on with the new model; a panel's
    conversation without ``seat`` is refused (its top-level model is no seat's). Written
    into metadata.json under the faces' lock. Returns ``model``, ``backend``, ``seat``
    (panels) and what they were (``was``)."""
    require_active(conv)
    if not model.strip():
        raise InputRejected("a model name cannot be empty")
    with faces_lock(conv):
        raw = read_json(conv.metadata)
        if raw is None:
            raise ContemplationError(f"{conv.id} has no readable metadata.json")
        entry = _seat_entry(conv, raw, seat)
        held = entry if entry is not None else raw
        was = {"model": str(held.get("model", "")), "backend": str(held.get("backend", ""))}
        alias = model if model in settings.aliases else None
        name = (
            backend or alias or was["backend"] or str(raw.get("backend", ""))
        ) or settings.default_backend
        if not backends.named(settings, name):
            raise InputRejected(str(backends.unknown(settings, name)))
        held.update(model=model.strip(), backend=name)
        atomic_write_json(conv.metadata, raw, durable=settings.durability == "fsync")
    out: dict[str, Any] = {"model": model.strip(), "backend": name, "was": was}
    if entry is not None:
        out["seat"] = entry.get("label")
    return out


def _seat_entry(conv: Conv, raw: dict[str, Any], seat: str | None) -> dict[str, Any] | None:
    """metadata.json's entry of the panel's ``seat`` (its label, any case); None for a
    conversation without a panel. Raises InputRejected for a panel's conversation without a
    seat or with one it has not, naming its seats."""
    entries = [
        s
        for s in [*(raw.get("panel") or []), raw.get("synthesize")]
        if isinstance(s, dict) and isinstance(s.get("label"), str)
    ]
    if not raw.get("panel"):
        if seat is not None:
            raise InputRejected(f"{conv.id} has no panel: leave out --seat")
        return None
    seats = ", ".join(f"{s['label']} ({s.get('model', '')})" for s in entries)
    if seat is None:
        raise InputRejected(
            f"{conv.id} is a panel: name the seat to move with --seat LABEL (its seats: {seats})"
        )
    found = [s for s in entries if str(s["label"]).upper() == seat.strip().upper()]
    if not found:
        raise InputRejected(f"{conv.id} has no seat {seat!r} (its seats: {seats})")
    return found[0]


def require_active(conv: Conv) -> None:
    """Refuse to change an archived conversation, saying where it is (every face's wording)."""
    if conv.is_completed:
        raise ContemplationError(
            f"{conv.id} is archived (in completed/); reopen it to continue "
            f"(`contemplation reopen {conv.id}`, or conversation_reopen)"
        )

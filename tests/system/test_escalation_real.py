"""The escalation ladder with a real model: SmolLM2 on the embedded backend loops at
temperature 0 (the loop watch stops it), and the ladder's next rung, a second alias of the
same embedded server with a sampling that does not loop, answers in its place. The real
daemon, the CLI's commands (in this process: what they print and exit with is what is shown
here, not the process; each in a new interpreter cost ~0.65 s), the log and the ledger's book."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest

from contemplation.models import BlockKind, MarkerKind, Status
from contemplation.protocol import escalation
from contemplation.protocol.parser import parse
from contemplation.store.layout import Conv, Home, read_state
from tests import peers
from tests.conftest import DaemonProc, base_env, cli_here
from tests.system.test_reply_cut import LOOP_ASK, set_options

pytestmark = pytest.mark.real

CONFIG = """
[escalation]
length = false  # a cut at the token limit is only marked here: the test is about the loop

[aliases.small]
model = "smollm2"
providers = ["local"]
escalate = ["steady", "agent"]

[aliases.steady]
model = "smollm2"
providers = ["local"]
options = { temperature = 0.7, repeat_penalty = 1.5, seed = 1, num_predict = 160 }
"""


@pytest.mark.timeout(1500)
def test_smollm2_loops_and_the_next_rung_of_the_same_server_answers(
    home: Home, daemon_factory: Callable[..., DaemonProc]
) -> None:
    peers.xllamacpp_available()
    peers.smollm2_gguf()
    config = home.root.parent / "xdg-config" / "contemplation" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(CONFIG)
    env = base_env(home, CONTEMPLATION_STOP_REPEATING="true")
    conv_id = cli_here(env, "new", "Folder queues", "--model", "small").stdout.strip()
    conv = Conv(home.active / conv_id)
    set_options(conv, temperature=0)  # the conversation's own: the rung's sampling goes over it
    # and only then the daemon: set_options rewrites metadata.json in place, and a daemon that
    # reads it half written leaves the turn for its next look (it took the folder for one
    # made by hand and wrote the defaults over it, seen once `new` ran in this process)
    daemon_factory(env, home).wait_ready()
    began = time.monotonic()
    r = cli_here(env, "send", conv_id, LOOP_ASK, "--wait", "--timeout", "1300", check=False)
    took = time.monotonic() - began
    print(f"\nsend --wait: exit {r.returncode} after {took:.1f} s\nstderr: {r.stderr[-600:]}")
    print(f"stdout (last 1200): {r.stdout[-1200:]}")
    assert r.returncode in (0, 5), (r.returncode, r.stderr[-2000:])
    assert f"=== ESCALATED: stopped repeating itself{escalation.ARROW}steady ===" in r.stdout
    models = [b for b in parse(conv.log.read_bytes()).blocks if b.kind is BlockKind.MODEL]
    looped, answer = models
    assert "the folder and" in looped.text  # what it said is kept
    assert [t for k, t in looped.markers if k is MarkerKind.ESCALATED] == [
        f"stopped repeating itself{escalation.ARROW}steady"
    ]
    assert escalation.rung_of(answer) == "steady" and answer.text.strip()
    assert not any(
        k is MarkerKind.NOTE and t.startswith("stopped: the model was repeating")
        for k, t in answer.markers
    ), answer.text  # the rung did not loop
    st = read_state(conv)
    assert st is not None and st.status is Status.IDLE and st.ladder is not None
    assert st.ladder.answered == {"steady": 1} and st.ladder.escalated == 1
    if r.returncode == 0:
        assert "rung: answered on steady (a rung of the escalation ladder)" in r.stderr
    ledger = json.loads(cli_here(env, "ledger", conv_id, "--json").stdout)
    print("ladder:", json.dumps(ledger["ladder"]))
    print("turns:", json.dumps(ledger["turns"]))
    print(f"looped: {len(looped.text)} characters; answer: {len(answer.text)} characters")

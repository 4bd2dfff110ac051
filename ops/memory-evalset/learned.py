#!/usr/bin/env python3
"""Whether a learned combination of the ranker's signals beats the fitted hybrid.

A pairwise logistic ranker (evidence against 40 sampled non-evidence candidates per
evidence message) over a `kvmem memory eval --dump` of the tuning half: the hybrid's
standardised signals, two products of them, the best hybrid score among each candidate's
same-session neighbours 1, 2 and 3 turns away, and the next and previous turns' cosines.
Each conversation's questions are ranked by weights learned on the other conversations
(leave one conversation out), beside the hybrid on the same candidates. Needs numpy.

  learned.py DUMP CHATS      CHATS: the half's import file (`build.py export tune DIR`)
"""
import collections
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fit  # noqa: E402

qs = fit.load(sys.argv[1]); pos = fit.positions(sys.argv[2])

def feats(q):
    cs = q["candidates"]
    def st(key):
        xs = [c["signals"][key] for c in cs if c["signals"][key] is not None]
        if not xs: return 0.0, 1.0
        mu = sum(xs)/len(xs); sd = math.sqrt(sum((x-mu)**2 for x in xs)/len(xs)) or 1.0
        return mu, sd
    (mu, sd), (smu, ssd) = st("semantic"), st("span")
    base = fit.standardised(q)
    z = lambda x, m, d, miss: miss if x is None else (x-m)/d
    rows = []
    at = {}
    for c in cs:
        if c["kind"] == "message":
            at[pos[(q["user_id"], c["id"])]] = c
    zs = {c["id"]: z(c["signals"]["semantic"], mu, sd, -2.0) for c in cs}
    zsp = {c["id"]: z(c["signals"]["span"], smu, ssd, -2.0) for c in cs}
    bs = {c["id"]: base(c) for c in cs}
    for c in cs:
        s = c["signals"]
        nb = {}
        if c["kind"] == "message":
            sess, i = pos[(q["user_id"], c["id"])]
            for d in (1, 2, 3):
                vals = [at.get((sess, j)) for j in (i-d, i+d)]
                nb[d] = max([bs[v["id"]] for v in vals if v is not None], default=None)
            nxt = at.get((sess, i+1)); prv = at.get((sess, i-1))
        else:
            nxt = prv = None
        f = [zs[c["id"]], zsp[c["id"]], s["bm25"], fit.rrf(s["window_rank"]),
             z(s["voice"], mu, sd, 0.0), float(s["voice"] is not None),
             s["lexical"], s.get("entity_freq") or 0.0,
             zs[c["id"]]*zsp[c["id"]], max(zs[c["id"]], zsp[c["id"]]),
             float(c["signals"]["span"] is None)]
        for d in (1, 2, 3):
            f += [0.0 if nb.get(d) is None else nb[d], float(nb.get(d) is not None)]
        f += [zs[nxt["id"]] if nxt else -2.0, zs[prv["id"]] if prv else -2.0]
        rows.append(f)
    return np.array(rows)

X = [feats(q) for q in qs]
ev = [set(q["evidence"]) for q in qs]
y = [np.array([float(any(i in e for i in c["sources"])) for c in q["candidates"]]) for q, e in zip(qs, ev)]
users = sorted({q["user_id"] for q in qs})
allX = np.vstack(X); mu = allX.mean(0); sd = allX.std(0) + 1e-9
Xn = [(x-mu)/sd for x in X]

def train(idx, l2=1e-2, epochs=300, lr=0.1):
    w = np.zeros(Xn[0].shape[1])
    # Each evidence candidate against up to 40 non-evidence ones of its question.
    P = []; N = []
    rng = np.random.default_rng(0)
    for i in idx:
        pos_ = np.where(y[i] > 0)[0]; neg = np.where(y[i] == 0)[0]
        if len(pos_) == 0 or len(neg) == 0: continue
        for p in pos_:
            ns = rng.choice(neg, size=min(40, len(neg)), replace=False)
            P.append(np.repeat(Xn[i][p][None], len(ns), 0)); N.append(Xn[i][ns])
    D = np.vstack(P) - np.vstack(N)
    for _ in range(epochs):
        m = D @ w
        g = -(D * (1/(1+np.exp(m)))[:, None]).mean(0) + l2*w
        w -= lr*g*10
    return w

def r_at(i, scores, k=10):
    q = qs[i]
    order = {c["id"]: s for c, s in zip(q["candidates"], scores)}
    return fit.recall(fit.ranked_ids(q, lambda c: order[c["id"]]), q["evidence"], k)

by = collections.defaultdict(list); base_by = collections.defaultdict(list)
for u in users:
    tr = [i for i, q in enumerate(qs) if q["user_id"] != u]
    te = [i for i, q in enumerate(qs) if q["user_id"] == u]
    w = train(tr)
    for i in te:
        r = r_at(i, Xn[i] @ w)
        by["all"].append(r); by[qs[i]["type"]].append(r)
        b = fit.standardised(qs[i])
        rb = fit.recall(fit.ranked_ids(qs[i], b), qs[i]["evidence"], 10)
        base_by["all"].append(rb); base_by[qs[i]["type"]].append(rb)
print("hybrid today:", {k: round(sum(v)/len(v), 3) for k, v in base_by.items()})
print("learned, one conversation out:", {k: round(sum(v)/len(v), 3) for k, v in by.items()})
w = train(range(len(qs)))
print("weights (all):", np.round(w, 3))

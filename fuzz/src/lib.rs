//! Shared code for kvmem's fuzz targets: the LLKV1 parser compiled in from
//! `worker/snapshot/format/` and the chat request reader from `worker/http/request/` (no
//! dependency on the kvmem crate, so no llama.cpp build), the limits the targets parse
//! with, the invariants every successful parse must satisfy, and structure-aware builders:
//! one makes valid snapshots and edits them so the fuzzer gets past the two CRC32Cs into
//! the deep parsing code, one makes chat requests near every bound the reader checks.

mod chat;
mod chat_plan;
mod plan;
#[path = "../../worker/http/request/mod.rs"]
pub mod request;
#[path = "../../worker/snapshot/format/mod.rs"]
pub mod snapshot;

use arbitrary::Arbitrary;
pub use chat::{check_chat_request, Headers, Rules};
pub use chat_plan::ChatPlan;
pub use plan::*;
use snapshot::{
    decode, encode, parse_header, parse_segments, Compression, Header, Limits, SegKind, Segment,
    Snapshot,
};

/// What the worker uses at `N_CTX=4096` (pipeline.rs: `n_ctx` tokens, `n_ctx` MiB of state).
pub const REALISTIC: Limits = Limits {
    max_tokens: 4096,
    max_state_bytes: 4096 << 20,
};

/// Every target parses with both.
pub const LIMITS: [Limits; 2] = [REALISTIC, Limits::LOOSE];

/// `decode` on untrusted bytes: must not panic; a success must be self-consistent and
/// survive `encode` → `decode`.
pub fn check_decode(file: &[u8]) {
    for limits in LIMITS {
        match decode(file, limits) {
            Ok(snap) => {
                check_snapshot(file, &snap, limits);
                check_round_trip(&snap, limits);
            }
            Err(e) => {
                // Display must not panic either (it formats untrusted text).
                let _ = e.to_string();
            }
        }
    }
}

/// `parse_header` on untrusted bytes: must not panic; a success must respect the limits
/// and point the body inside the file.
pub fn check_header(file: &[u8]) {
    for limits in LIMITS {
        match parse_header(file, limits) {
            Ok((h, body_start)) => {
                check_header_fields(&h, limits);
                assert!(body_start <= file.len(), "body starts past the end");
                assert!(
                    file[..body_start].ends_with(b"\n\n"),
                    "body does not start after the blank line"
                );
                assert!(
                    body_start <= 64 * 1024 + 1,
                    "header longer than the maximum"
                );
            }
            Err(e) => {
                let _ = e.to_string();
            }
        }
    }
}

/// `parse_segments`: must not panic; a success tiles exactly `tokens` positions with
/// non-empty segments, the base prompt (if any) first, and renders back to itself.
pub fn check_segments(text: &str, tokens: u32) {
    match parse_segments(text, tokens) {
        Ok(segs) => {
            let total: u64 = segs.iter().map(|s| s.len as u64).sum();
            assert_eq!(
                total, tokens as u64,
                "segments do not sum to the token count"
            );
            assert!(segs.len() <= 1 << 16, "more segments than MAX_SEGMENTS");
            assert!(segs.iter().all(|s| s.len > 0), "empty segment accepted");
            assert!(
                segs.iter().skip(1).all(|s| s.kind != SegKind::Base),
                "base segment accepted after the first position"
            );
            assert!(
                segs.iter()
                    .rev()
                    .skip(1)
                    .all(|s| s.kind != SegKind::Hud),
                "HUD segment accepted before the last position"
            );
            let again = parse_segments(&render_segments(&segs), tokens)
                .expect("rendered segments do not parse");
            assert_eq!(again, segs, "segments do not round-trip");
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
}

fn render_segments(segs: &[Segment]) -> String {
    segs.iter()
        .map(|s| {
            let code = match s.kind {
                SegKind::Base => 'B',
                SegKind::Turn => 'T',
                SegKind::Digest => 'D',
                SegKind::Context => 'C',
                SegKind::Recall => 'M',
                SegKind::Hud => 'H',
            };
            // Written here, not with the worker's renderer, so the round trip checks
            // the parser against an independent reading of the table's grammar.
            if s.tag.is_empty() {
                format!("{code}:{}", s.len)
            } else {
                format!("{code}:{}@{}", s.len, s.tag)
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

fn check_header_fields(h: &Header, limits: Limits) {
    assert!(h.tokens <= limits.max_tokens, "tokens over the limit");
    assert!(h.bytes <= limits.max_state_bytes, "bytes over the limit");
    assert!(
        h.stored_bytes <= limits.max_state_bytes,
        "stored_bytes over the limit"
    );
    let total: u64 = h.segments.iter().map(|s| s.len as u64).sum();
    assert_eq!(total, h.tokens as u64, "segments do not tile the tokens");
}

/// Invariants of a successful decode against the file it came from.
pub fn check_snapshot(file: &[u8], snap: &Snapshot, limits: Limits) {
    let h = &snap.header;
    check_header_fields(h, limits);
    assert_eq!(snap.token_ids.len(), h.tokens as usize, "token count");
    assert_eq!(snap.state.len() as u64, h.bytes, "state size");
    let (h2, body_start) = parse_header(file, limits).expect("decode ok but parse_header fails");
    assert_eq!(&h2, h, "parse_header and decode disagree");
    let token_len = h.tokens as usize * 4;
    assert_eq!(
        body_start as u64 + token_len as u64 + h.stored_bytes,
        file.len() as u64,
        "file length"
    );
    let body = &file[body_start..];
    assert_eq!(crc32c::crc32c(body), h.crc32c, "payload CRC not checked");
    let payload = &body[token_len..];
    match h.compression {
        Compression::None => assert_eq!(payload, &snap.state[..], "uncompressed state"),
        // Differential: the state is what a strict one-shot zstd decompression gives (no
        // trailing bytes, no second reading). `bytes` is real here: decode produced it.
        Compression::Zstd => assert!(
            zstd::bulk::decompress(payload, h.bytes as usize)
                .ok()
                .as_deref()
                == Some(&snap.state[..]),
            "zstd state differs from a one-shot decompression"
        ),
    }
}

/// `decode(encode(x)) == x` for everything that is not derived from the body.
pub fn check_round_trip(snap: &Snapshot, limits: Limits) {
    let mut filled = snap.header.clone();
    let file = encode(&mut filled, &snap.token_ids, &snap.state).expect("encode failed");
    let again = decode(&file, limits)
        .unwrap_or_else(|e| panic!("re-encoded snapshot does not decode: {e}"));
    assert_eq!(
        again.header, filled,
        "encode's header differs from its decode"
    );
    let mut expected = snap.header.clone();
    if expected.compression == Compression::Zstd {
        // Our zstd output may differ from the file's (another level, another encoder).
        expected.crc32c = filled.crc32c;
        expected.stored_bytes = filled.stored_bytes;
    }
    assert_eq!(again.header, expected, "header does not round-trip");
    assert_eq!(
        again.token_ids, snap.token_ids,
        "token ids do not round-trip"
    );
    assert!(again.state == snap.state, "state does not round-trip");
}

// ---------------------------------------------------------------------------------------
// Structure-aware input: a valid snapshot built from small fuzzer-chosen fields, then
// edited (header lines, body bytes) with the CRCs optionally recomputed afterwards.
// ---------------------------------------------------------------------------------------

/// The header keys `render_header` writes, in its order (without `header_crc32c`).
pub const KEYS: [&str; 17] = [
    "format_version",
    "model_sha",
    "digest_version",
    "crc32c",
    "tokens",
    "bytes",
    "stored_bytes",
    "timestamp",
    "llama_build",
    "n_ctx",
    "type_k",
    "type_v",
    "compression",
    "scope",
    "turn_id",
    "fence",
    "segments",
];

//! LLKV1 snapshot files: a session's llama.cpp KV state between turns, framed so that a
//! torn, corrupt or foreign file is always detected and turns into a cold start, never a
//! crash or a wrong resume.
//!
//! Layout (all integers little-endian):
//! ```text
//! LLKV1\n                      magic line
//! key=value\n ...              header lines (ASCII), see `Header`
//! header_crc32c=<u32>\n        CRC32C of every header byte before this line
//! \n                           end of header
//! token ids                    tokens × i32
//! payload                      stored_bytes of llama.cpp sequence state (zstd if compressed)
//! ```
//! `crc32c` covers the token ids and the payload. The file is untrusted input: every
//! length is checked against the file's real size and fixed limits before anything is
//! allocated from it.

// Compiled on its own by the fuzz crate (fuzz/src/lib.rs): no I/O and no crates but
// crc32c, zstd and thiserror here or in the files below, and only `super::` paths.
mod parse;
mod render;
mod types;

pub use parse::{decode, parse_header, parse_segments};
pub use render::{encode, render_segments};

pub use types::{
    valid_tag, Compression, Header, Limits, SegKind, Segment, Snapshot, SnapshotError, CPU_DEVICE,
    FORMAT_VERSION, MAGIC, MAX_HEADER_BYTES,
};

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn header() -> Header {
        Header::new(&"ab".repeat(32), "b1", "s")
            .with_digest(&"cd".repeat(32))
            .with_timestamp(1_700_000_000)
            .with_kv(4096, "f16")
            .with_compression(Compression::Zstd)
            .with_turn(7, 3)
            .with_segments(vec![
                Segment::new(SegKind::Base, 3),
                Segment::tagged(SegKind::Turn, 2, "7"),
            ])
    }

    pub(crate) fn sample() -> (Header, Vec<u8>) {
        let mut h = header();
        let state: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        let file = encode(&mut h, &[1, 2, 3, 4, 5], &state).unwrap();
        (h, file)
    }

    #[test]
    fn round_trip_keeps_everything() {
        for compression in [Compression::Zstd, Compression::None] {
            let mut h = header();
            h.compression = compression;
            let state = vec![7u8; 3000];
            let file = encode(&mut h, &[1, 2, 3, 4, 5], &state).unwrap();
            let snap = decode(&file, Limits::LOOSE).unwrap();
            assert_eq!(snap.header, h);
            assert_eq!(snap.token_ids, vec![1, 2, 3, 4, 5]);
            assert_eq!(snap.state, state);
        }
    }

    #[test]
    fn every_flipped_byte_is_detected() {
        let (_, file) = sample();
        for i in 0..file.len() {
            let mut bad = file.clone();
            bad[i] ^= 0x01;
            assert!(
                decode(&bad, Limits::LOOSE).is_err(),
                "flip at {i} went unnoticed"
            );
        }
    }

    #[test]
    fn every_truncation_is_detected() {
        let (_, file) = sample();
        for len in 0..file.len() {
            assert!(
                decode(&file[..len], Limits::LOOSE).is_err(),
                "truncation at {len}"
            );
        }
    }

    #[test]
    fn huge_claims_are_refused_before_allocating() {
        let mut h = header();
        h.compression = Compression::None;
        let mut f = encode(&mut h, &[1, 2, 3, 4, 5], &[0u8; 10]).unwrap();
        // Rewrite bytes= to 2^40 and fix the header CRC so only the limit can catch it.
        let s = String::from_utf8_lossy(&f).to_string();
        let end = s.find("\n\n").unwrap() + 2;
        let head = s[..end].replace("bytes=10\n", &format!("bytes={}\n", 1u64 << 40));
        let crc_at = head.rfind("header_crc32c=").unwrap();
        let crc = crc32c::crc32c(&head.as_bytes()[..crc_at]);
        let head = format!("{}header_crc32c={crc}\n\n", &head[..crc_at]);
        let mut forged = head.into_bytes();
        forged.extend_from_slice(&f.split_off(end));
        let err = decode(&forged, Limits::LOOSE).unwrap_err();
        assert!(
            matches!(err, SnapshotError::Limit { field: "bytes", .. }),
            "{err}"
        );
    }

    #[test]
    fn kv_device_round_trips_and_older_files_read_as_cpu() {
        let mut h = header().with_kv_device("Vulkan0:30/30");
        let mut f = encode(&mut h, &[1, 2, 3, 4, 5], &[9u8; 40]).unwrap();
        let snap = decode(&f, Limits::LOOSE).unwrap();
        assert_eq!(snap.header.kv_device, "Vulkan0:30/30");
        // A file from before the key: the same header without its line, CRC made anew.
        let s = String::from_utf8_lossy(&f).to_string();
        let end = s.find("\n\n").unwrap() + 2;
        let head = s[..end].replace("kv_device=Vulkan0:30/30\n", "");
        assert_ne!(head.len(), end, "the line was there");
        let crc_at = head.rfind("header_crc32c=").unwrap();
        let crc = crc32c::crc32c(&head.as_bytes()[..crc_at]);
        let mut old = format!("{}header_crc32c={crc}\n\n", &head[..crc_at]).into_bytes();
        old.extend_from_slice(&f.split_off(end));
        let snap = decode(&old, Limits::LOOSE).unwrap();
        assert_eq!(snap.header.kv_device, CPU_DEVICE);
        assert_eq!(snap.state, vec![9u8; 40]);
    }

    #[test]
    fn segments_must_tile_the_tokens() {
        assert!(parse_segments("B:3,T:2", 5).is_ok());
        assert!(parse_segments("B:3,T:2", 6).is_err());
        assert!(parse_segments("T:3,B:2", 5).is_err());
        assert!(parse_segments("B:0,T:5", 5).is_err());
        assert!(parse_segments("X:5", 5).is_err());
        assert!(parse_segments("", 0).unwrap().is_empty());
        assert!(parse_segments("B:3,T:2@x-y", 5).is_err());
    }

    #[test]
    fn segment_tags_round_trip() {
        let segs = vec![
            Segment::new(SegKind::Base, 3),
            Segment::tagged(SegKind::Turn, 4, "41"),
            Segment::tagged(SegKind::Context, 2, "ab12"),
            Segment::tagged(SegKind::Recall, 5, "m12.x7.c9f"),
        ];
        let text = render_segments(&segs);
        assert_eq!(text, "B:3,T:4@41,C:2@ab12,M:5@m12.x7.c9f");
        assert_eq!(parse_segments(&text, 14).unwrap(), segs);
        let items: Vec<&str> = segs[3].items().collect();
        assert_eq!(items, ["m12", "x7", "c9f"]);
        assert_eq!(segs[1].items().count(), 0);
    }
}

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

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// First line of every snapshot.
pub const MAGIC: &str = "LLKV1";
/// Bumped on any incompatible change to the layout.
pub const FORMAT_VERSION: u32 = 2;
/// A header is a few hundred bytes; anything this long is not a header.
const MAX_HEADER_BYTES: usize = 64 * 1024;
/// More segments than this means a corrupt table (a turn is at least a few tokens).
const MAX_SEGMENTS: usize = 1 << 16;
/// A real header has 18 lines; a file with many more is not one of ours.
const MAX_HEADER_LINES: usize = 64;
/// The most a zstd payload can expand: a block of at least 4 bytes gives at most 128 KiB.
/// Bounding the output buffer by it means a tiny file can never reserve gigabytes.
const MAX_ZSTD_RATIO: u64 = (128 * 1024) / 4;

/// What a segment of the KV holds; pruning and digest tracking work on these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegKind {
    /// The base system prompt, always the prefix and never pruned.
    Base,
    /// One exchange: the user message and the reply.
    Turn,
    /// An injected digest.
    Digest,
}

impl SegKind {
    fn code(self) -> char {
        match self {
            SegKind::Base => 'B',
            SegKind::Turn => 'T',
            SegKind::Digest => 'D',
        }
    }

    fn from_code(c: &str) -> Option<SegKind> {
        match c {
            "B" => Some(SegKind::Base),
            "T" => Some(SegKind::Turn),
            "D" => Some(SegKind::Digest),
            _ => None,
        }
    }
}

/// A contiguous run of KV positions. Positions are implied: segments tile 0..tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub kind: SegKind,
    pub len: u32,
}

/// Payload encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Zstd,
}

/// Everything in the header. `crc32c`, `tokens`, `bytes` and `stored_bytes` are derived
/// from the body by [`encode`]; the rest describes what the state is valid for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub format_version: u32,
    pub model_sha: String,
    /// The digest version the KV has seen last ("" if none).
    pub digest_version: String,
    pub crc32c: u32,
    pub tokens: u32,
    /// Raw llama.cpp state size.
    pub bytes: u64,
    /// Payload size in the file.
    pub stored_bytes: u64,
    /// Unix seconds at save.
    pub timestamp: u64,
    /// llama.cpp build the state came from.
    pub llama_build: String,
    pub n_ctx: u32,
    pub type_k: String,
    pub type_v: String,
    pub compression: Compression,
    /// Hash of (user, character, session): a snapshot is only ever used for its own scope.
    pub scope: String,
    /// The last turn whose exchange is in the KV.
    pub turn_id: i64,
    /// The fencing token of the attempt that wrote the file. A snapshot is trusted only
    /// when the session's last committed turn carries this same token (`turns.done_token`):
    /// a worker that lost its lease cannot make its file look like the committed one.
    pub fence: i64,
    pub segments: Vec<Segment>,
}

/// A decoded, verified snapshot.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub header: Header,
    pub token_ids: Vec<i32>,
    /// Raw llama.cpp sequence state (decompressed).
    pub state: Vec<u8>,
}

/// Why a file is not a usable snapshot.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SnapshotError {
    #[error("not an LLKV1 file (bad magic)")]
    BadMagic,
    #[error("header is unterminated or longer than {MAX_HEADER_BYTES} bytes")]
    HeaderTooLong,
    #[error("header is malformed: {0}")]
    Malformed(String),
    #[error("header CRC32C mismatch")]
    HeaderCrc,
    #[error("payload CRC32C mismatch (stored {stored:08x}, computed {computed:08x})")]
    PayloadCrc { stored: u32, computed: u32 },
    #[error("file is {actual} bytes, header says {expected}: truncated or padded")]
    Length { expected: u64, actual: u64 },
    #[error("{field} = {value} is over the limit of {limit}")]
    Limit {
        field: &'static str,
        value: u64,
        limit: u64,
    },
    #[error("decompression failed: {0}")]
    Decompress(String),
}

/// Bounds for an untrusted file, derived from the running engine.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_tokens: u32,
    pub max_state_bytes: u64,
}

impl Limits {
    /// Generous bounds for parsing any plausible file (tools, fuzzing).
    pub const LOOSE: Limits = Limits {
        max_tokens: 1 << 20,
        max_state_bytes: 8 << 30,
    };
}

/// Serialises header + tokens + state. Fills in the derived header fields.
pub fn encode(header: &mut Header, token_ids: &[i32], state: &[u8]) -> io::Result<Vec<u8>> {
    let payload = match header.compression {
        Compression::Zstd => zstd::bulk::compress(state, 1)?,
        Compression::None => state.to_vec(),
    };
    let token_bytes: Vec<u8> = token_ids.iter().flat_map(|t| t.to_le_bytes()).collect();
    let mut crc = crc32c::crc32c(&token_bytes);
    crc = crc32c::crc32c_append(crc, &payload);
    header.crc32c = crc;
    header.tokens = token_ids.len() as u32;
    header.bytes = state.len() as u64;
    header.stored_bytes = payload.len() as u64;
    let head = render_header(header);
    let mut out = Vec::with_capacity(head.len() + token_bytes.len() + payload.len());
    out.extend_from_slice(head.as_bytes());
    out.extend_from_slice(&token_bytes);
    out.extend_from_slice(&payload);
    Ok(out)
}

fn render_header(h: &Header) -> String {
    let segments: Vec<String> = h
        .segments
        .iter()
        .map(|s| format!("{}:{}", s.kind.code(), s.len))
        .collect();
    let compression = match h.compression {
        Compression::None => "none",
        Compression::Zstd => "zstd",
    };
    let mut text = format!(
        "{MAGIC}\nformat_version={}\nmodel_sha={}\ndigest_version={}\ncrc32c={}\ntokens={}\n\
         bytes={}\nstored_bytes={}\ntimestamp={}\nllama_build={}\nn_ctx={}\ntype_k={}\n\
         type_v={}\ncompression={}\nscope={}\nturn_id={}\nfence={}\nsegments={}\n",
        h.format_version,
        h.model_sha,
        h.digest_version,
        h.crc32c,
        h.tokens,
        h.bytes,
        h.stored_bytes,
        h.timestamp,
        h.llama_build,
        h.n_ctx,
        h.type_k,
        h.type_v,
        compression,
        h.scope,
        h.turn_id,
        h.fence,
        segments.join(",")
    );
    let crc = crc32c::crc32c(text.as_bytes());
    text.push_str(&format!("header_crc32c={crc}\n\n"));
    text
}

/// Parses and verifies a whole file. Never panics, whatever the bytes.
pub fn decode(file: &[u8], limits: Limits) -> Result<Snapshot, SnapshotError> {
    let (header, body_start) = parse_header(file, limits)?;
    let token_len = header.tokens as u64 * 4;
    let expected = body_start as u64 + token_len + header.stored_bytes;
    if expected != file.len() as u64 {
        return Err(SnapshotError::Length {
            expected,
            actual: file.len() as u64,
        });
    }
    let body = &file[body_start..];
    let (token_bytes, payload) = body.split_at(token_len as usize);
    let computed = crc32c::crc32c_append(crc32c::crc32c(token_bytes), payload);
    if computed != header.crc32c {
        return Err(SnapshotError::PayloadCrc {
            stored: header.crc32c,
            computed,
        });
    }
    let token_ids = token_bytes
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let state = match header.compression {
        Compression::None => payload.to_vec(),
        // Capacity: the header's `bytes` (checked against the limit), but never more than
        // this payload could possibly produce.
        Compression::Zstd => {
            let capacity = header.bytes.min(payload.len() as u64 * MAX_ZSTD_RATIO);
            zstd::bulk::decompress(payload, capacity as usize)
                .map_err(|e| SnapshotError::Decompress(e.to_string()))?
        }
    };
    if state.len() as u64 != header.bytes {
        return Err(SnapshotError::Decompress(format!(
            "got {} bytes, header says {}",
            state.len(),
            header.bytes
        )));
    }
    Ok(Snapshot {
        header,
        token_ids,
        state,
    })
}

/// Parses the header only, returning it and where the body starts.
pub fn parse_header(file: &[u8], limits: Limits) -> Result<(Header, usize), SnapshotError> {
    if !file.starts_with(b"LLKV1\n") {
        return Err(SnapshotError::BadMagic);
    }
    let window = &file[..file.len().min(MAX_HEADER_BYTES)];
    let end = window
        .windows(2)
        .position(|w| w == b"\n\n")
        .ok_or(SnapshotError::HeaderTooLong)?;
    let text = std::str::from_utf8(&file[..end + 1])
        .map_err(|_| SnapshotError::Malformed("header is not UTF-8".into()))?;
    let crc_at = text
        .rfind("header_crc32c=")
        .ok_or_else(|| SnapshotError::Malformed("no header_crc32c".into()))?;
    let stored: u32 = parse_num(text[crc_at..].trim_end(), "header_crc32c")?;
    if crc32c::crc32c(&text.as_bytes()[..crc_at]) != stored {
        return Err(SnapshotError::HeaderCrc);
    }
    let fields = Fields::parse(&text[MAGIC.len() + 1..crc_at])?;
    let header = fields.into_header(limits)?;
    Ok((header, end + 2))
}

fn parse_num<T: std::str::FromStr>(line: &str, key: &str) -> Result<T, SnapshotError> {
    let value = line
        .strip_prefix(key)
        .and_then(|r| r.strip_prefix('='))
        .ok_or_else(|| SnapshotError::Malformed(format!("expected {key}=")))?;
    value
        .parse()
        .map_err(|_| SnapshotError::Malformed(format!("{key} is not a number")))
}

/// The header's key=value lines, each key at most once.
struct Fields<'a>(Vec<(&'a str, &'a str)>);

impl<'a> Fields<'a> {
    fn parse(text: &'a str) -> Result<Fields<'a>, SnapshotError> {
        let mut pairs: Vec<(&str, &str)> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        // Only '\n' ends a line: `str::lines` would also eat a '\r' that is part of a value.
        for line in text.split_terminator('\n') {
            if pairs.len() >= MAX_HEADER_LINES {
                return Err(SnapshotError::Malformed("too many header lines".into()));
            }
            let (k, v) = line
                .split_once('=')
                .ok_or_else(|| SnapshotError::Malformed(format!("line without '=': {line:.40}")))?;
            if !seen.insert(k) {
                return Err(SnapshotError::Malformed(format!("duplicate key {k:.40}")));
            }
            pairs.push((k, v));
        }
        Ok(Fields(pairs))
    }

    fn str(&self, key: &str) -> Result<&'a str, SnapshotError> {
        self.0
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| *v)
            .ok_or_else(|| SnapshotError::Malformed(format!("missing {key}")))
    }

    fn num<T: std::str::FromStr>(&self, key: &str) -> Result<T, SnapshotError> {
        self.str(key)?
            .parse()
            .map_err(|_| SnapshotError::Malformed(format!("{key} is not a number")))
    }

    fn into_header(self, limits: Limits) -> Result<Header, SnapshotError> {
        let tokens: u32 = self.num("tokens")?;
        let bytes: u64 = self.num("bytes")?;
        let stored_bytes: u64 = self.num("stored_bytes")?;
        check_limit("tokens", tokens as u64, limits.max_tokens as u64)?;
        check_limit("bytes", bytes, limits.max_state_bytes)?;
        check_limit("stored_bytes", stored_bytes, limits.max_state_bytes)?;
        let compression = match self.str("compression")? {
            "none" => Compression::None,
            "zstd" => Compression::Zstd,
            other => {
                return Err(SnapshotError::Malformed(format!(
                    "unknown compression {other:.20}"
                )))
            }
        };
        let segments = parse_segments(self.str("segments")?, tokens)?;
        Ok(Header {
            format_version: self.num("format_version")?,
            model_sha: self.str("model_sha")?.to_string(),
            digest_version: self.str("digest_version")?.to_string(),
            crc32c: self.num("crc32c")?,
            tokens,
            bytes,
            stored_bytes,
            timestamp: self.num("timestamp")?,
            llama_build: self.str("llama_build")?.to_string(),
            n_ctx: self.num("n_ctx")?,
            type_k: self.str("type_k")?.to_string(),
            type_v: self.str("type_v")?.to_string(),
            compression,
            scope: self.str("scope")?.to_string(),
            turn_id: self.num("turn_id")?,
            fence: self.num("fence")?,
            segments,
        })
    }
}

fn check_limit(field: &'static str, value: u64, limit: u64) -> Result<(), SnapshotError> {
    if value > limit {
        return Err(SnapshotError::Limit {
            field,
            value,
            limit,
        });
    }
    Ok(())
}

/// Parses `B:57,T:120,...`. The segments must tile exactly `tokens` positions, and
/// the base prompt, when present, must come first.
pub fn parse_segments(text: &str, tokens: u32) -> Result<Vec<Segment>, SnapshotError> {
    if text.is_empty() {
        return if tokens == 0 {
            Ok(Vec::new())
        } else {
            Err(SnapshotError::Malformed(
                "segments do not cover the tokens".into(),
            ))
        };
    }
    let mut out = Vec::new();
    let mut total: u64 = 0;
    for item in text.split(',') {
        if out.len() >= MAX_SEGMENTS {
            return Err(SnapshotError::Malformed("too many segments".into()));
        }
        let (kind, len) = item
            .split_once(':')
            .ok_or_else(|| SnapshotError::Malformed("segment without ':'".into()))?;
        let kind = SegKind::from_code(kind)
            .ok_or_else(|| SnapshotError::Malformed("unknown segment kind".into()))?;
        let len: u32 = len
            .parse()
            .map_err(|_| SnapshotError::Malformed("segment length is not a number".into()))?;
        if len == 0 || (kind == SegKind::Base && !out.is_empty()) {
            return Err(SnapshotError::Malformed(
                "empty or misplaced segment".into(),
            ));
        }
        total += len as u64;
        out.push(Segment { kind, len });
    }
    if total != tokens as u64 {
        return Err(SnapshotError::Malformed(format!(
            "segments cover {total} tokens, header says {tokens}"
        )));
    }
    Ok(out)
}

/// Where snapshots live: one file per session scope, replaced atomically.
#[derive(Debug, Clone)]
pub struct SnapshotStore {
    dir: PathBuf,
    limits: Limits,
}

/// The result of looking for a session's snapshot.
#[derive(Debug)]
pub enum Loaded {
    /// No snapshot yet.
    Missing,
    /// A verified snapshot. Whether it fits the running engine is the caller's check.
    Found(Box<Snapshot>),
    /// The file was corrupt and has been renamed to `quarantined`.
    Corrupt {
        error: SnapshotError,
        quarantined: Option<PathBuf>,
    },
    /// The file could not be read at all (permissions, I/O).
    Unreadable(String),
}

impl SnapshotStore {
    pub fn new(dir: impl Into<PathBuf>, limits: Limits) -> SnapshotStore {
        SnapshotStore {
            dir: dir.into(),
            limits,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file for a scope key (see [`scope_key`]).
    pub fn path(&self, scope: &str) -> PathBuf {
        self.dir.join(format!("{scope}.llkv"))
    }

    /// Reads and verifies; a corrupt file is quarantined, never deleted.
    pub fn load(&self, scope: &str) -> Loaded {
        let path = self.path(scope);
        let len = match fs::metadata(&path) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Loaded::Missing,
            Err(e) => return Loaded::Unreadable(e.to_string()),
        };
        // Bound the read by what a valid file could be, before allocating.
        let max_len = MAX_HEADER_BYTES as u64
            + self.limits.max_tokens as u64 * 4
            + self.limits.max_state_bytes;
        if len > max_len {
            let error = SnapshotError::Limit {
                field: "file size",
                value: len,
                limit: max_len,
            };
            return self.quarantine_corrupt(&path, error);
        }
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Loaded::Missing,
            Err(e) => return Loaded::Unreadable(e.to_string()),
        };
        match decode(&bytes, self.limits) {
            Ok(snap) if snap.header.scope != scope => self.quarantine_corrupt(
                &path,
                SnapshotError::Malformed("snapshot belongs to another scope".into()),
            ),
            Ok(snap) => Loaded::Found(Box::new(snap)),
            Err(error) => self.quarantine_corrupt(&path, error),
        }
    }

    fn quarantine_corrupt(&self, path: &Path, error: SnapshotError) -> Loaded {
        Loaded::Corrupt {
            error,
            quarantined: quarantine_path(path),
        }
    }

    /// Moves a scope's snapshot aside as `<scope>.<millis>.bad`; never deletes it.
    pub fn quarantine(&self, scope: &str) -> Option<PathBuf> {
        quarantine_path(&self.path(scope))
    }

    /// Writes tmp → fsync → rename → fsync(dir). Returns the file size.
    pub fn save(&self, scope: &str, encoded: &[u8]) -> io::Result<u64> {
        self.save_with(scope, encoded, &|_| {})
    }

    /// [`save`](Self::save), calling `at` with the step reached (`mid_write`,
    /// `before_rename`): the seam reliability tests use to stop a writer at an exact point.
    pub fn save_with(&self, scope: &str, encoded: &[u8], at: &dyn Fn(&str)) -> io::Result<u64> {
        fs::create_dir_all(&self.dir)?;
        let path = self.path(scope);
        let tmp = self
            .dir
            .join(format!(".{scope}.{}.tmp", std::process::id()));
        let result = (|| {
            let mut f = File::create(&tmp)?;
            let (first, rest) = encoded.split_at(encoded.len() / 2);
            f.write_all(first)?;
            at("mid_write");
            f.write_all(rest)?;
            f.sync_all()?;
            at("before_rename");
            fs::rename(&tmp, &path)?;
            File::open(&self.dir)?.sync_all()
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result.map(|_| encoded.len() as u64)
    }

    /// Deletes temp files that writers killed before their rename left behind (`save`
    /// names them per process, so a restarted worker never reuses one). Only files older
    /// than `min_age` go: a save takes well under a second, and another worker sharing
    /// the directory may be writing right now. Returns how many were removed.
    pub fn sweep_stale_tmp(&self, min_age: std::time::Duration) -> io::Result<usize> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(e),
        };
        let mut removed = 0;
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if !(name.starts_with('.') && name.ends_with(".tmp")) {
                continue;
            }
            let age = entry.metadata()?.modified()?.elapsed().unwrap_or_default();
            if age >= min_age && fs::remove_file(entry.path()).is_ok() {
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Removes a session's snapshot (after a rollback run, or by ops).
    pub fn remove(&self, scope: &str) -> io::Result<()> {
        match fs::remove_file(self.path(scope)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

fn quarantine_path(path: &Path) -> Option<PathBuf> {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let bad = path.with_extension(format!("{stamp}.bad"));
    fs::rename(path, &bad).ok().map(|_| bad)
}

/// The file-name-safe key for a session's scope: the same session id under another user
/// or character never shares a snapshot.
pub fn scope_key(user_id: &str, character_id: i64, session_id: &str) -> String {
    let mut h = Sha256::new();
    for part in [user_id, &character_id.to_string(), session_id] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    hex::encode(&h.finalize()[..16])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        Header {
            format_version: FORMAT_VERSION,
            model_sha: "ab".repeat(32),
            digest_version: "cd".repeat(32),
            crc32c: 0,
            tokens: 0,
            bytes: 0,
            stored_bytes: 0,
            timestamp: 1_700_000_000,
            llama_build: "b1".into(),
            n_ctx: 4096,
            type_k: "f16".into(),
            type_v: "f16".into(),
            compression: Compression::Zstd,
            scope: "s".into(),
            turn_id: 7,
            fence: 3,
            segments: vec![
                Segment {
                    kind: SegKind::Base,
                    len: 3,
                },
                Segment {
                    kind: SegKind::Turn,
                    len: 2,
                },
            ],
        }
    }

    fn sample() -> (Header, Vec<u8>) {
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
    fn segments_must_tile_the_tokens() {
        assert!(parse_segments("B:3,T:2", 5).is_ok());
        assert!(parse_segments("B:3,T:2", 6).is_err());
        assert!(parse_segments("T:3,B:2", 5).is_err());
        assert!(parse_segments("B:0,T:5", 5).is_err());
        assert!(parse_segments("X:5", 5).is_err());
        assert!(parse_segments("", 0).unwrap().is_empty());
    }

    #[test]
    fn store_quarantines_corrupt_files() {
        let dir = tempfile::tempdir().unwrap();
        let store = SnapshotStore::new(dir.path(), Limits::LOOSE);
        let (mut h, _) = sample();
        h.scope = "scope1".into();
        let file = encode(&mut h, &[1, 2, 3, 4, 5], &[9u8; 100]).unwrap();
        store.save("scope1", &file).unwrap();
        assert!(matches!(store.load("scope1"), Loaded::Found(_)));
        let mut bad = file.clone();
        let last = bad.len() - 1;
        bad[last] ^= 0xff;
        store.save("scope1", &bad).unwrap();
        match store.load("scope1") {
            Loaded::Corrupt {
                quarantined: Some(q),
                ..
            } => assert!(q.exists() && q.to_string_lossy().ends_with(".bad")),
            other => panic!("expected quarantine, got {other:?}"),
        }
        assert!(matches!(store.load("scope1"), Loaded::Missing));
    }

    #[test]
    fn stale_temp_files_are_swept_and_fresh_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = SnapshotStore::new(dir.path(), Limits::LOOSE);
        let old = dir.path().join(".scope1.4242.tmp");
        let fresh = dir.path().join(".scope2.4243.tmp");
        let snapshot = dir.path().join("scope3.llkv");
        for p in [&old, &fresh, &snapshot] {
            std::fs::write(p, b"x").unwrap();
        }
        let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        File::options()
            .write(true)
            .open(&old)
            .unwrap()
            .set_modified(hour_ago)
            .unwrap();
        let removed = store
            .sweep_stale_tmp(std::time::Duration::from_secs(600))
            .unwrap();
        assert_eq!(removed, 1);
        assert!(!old.exists() && fresh.exists() && snapshot.exists());
        let missing = SnapshotStore::new(dir.path().join("nope"), Limits::LOOSE);
        assert_eq!(
            missing.sweep_stale_tmp(std::time::Duration::ZERO).unwrap(),
            0
        );
    }

    #[test]
    fn a_snapshot_under_another_scope_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = SnapshotStore::new(dir.path(), Limits::LOOSE);
        let mut h = header();
        h.scope = "other".into();
        let file = encode(&mut h, &[1, 2, 3, 4, 5], &[1u8; 10]).unwrap();
        store.save("mine", &file).unwrap();
        assert!(matches!(store.load("mine"), Loaded::Corrupt { .. }));
    }

    #[test]
    fn scope_keys_separate_users() {
        assert_ne!(scope_key("u1", 1, "s"), scope_key("u2", 1, "s"));
        assert_ne!(scope_key("u1", 1, "s"), scope_key("u1", 2, "s"));
        assert_ne!(scope_key("u1", 12, "s"), scope_key("u11", 2, "s"));
        assert_eq!(scope_key("u1", 1, "s").len(), 32);
    }
}

//! Structured inputs: a plan of edits over a valid LLKV1 file, built into bytes and
//! checked against what the parser must say of them.

use super::*;

const MAX_STR: usize = 64;
const MAX_SEGS: usize = 24;
const MAX_STATE: usize = 16 * 1024;

/// The fields of a valid snapshot; `build` turns them into one.
#[derive(Debug, Arbitrary)]
pub struct Base {
    pub zstd: bool,
    pub format_version: Option<u32>,
    pub model_sha: String,
    pub digest_version: String,
    pub llama_build: String,
    pub type_k: String,
    pub type_v: String,
    pub scope: String,
    pub timestamp: u64,
    pub n_ctx: u32,
    pub turn_id: i64,
    pub fence: i64,
    /// (kind, length-1); a base segment after the first position becomes a turn.
    pub segments: Vec<(u8, u8)>,
    pub token_ids: Vec<i32>,
    /// The state is `pattern` repeated to `state_len` bytes (compressible or not).
    pub pattern: Vec<u8>,
    pub state_len: u16,
}

/// A header value: numbers near the limits and the integer types' edges, or text.
#[derive(Debug, Arbitrary)]
pub enum Value {
    Interesting(u8),
    U64(u64),
    I64(i64),
    /// The current value ± a small delta (for numeric fields).
    Nudge(i8),
    Text(String),
}

const INTERESTING: [&str; 30] = [
    "0",
    "1",
    "-1",
    "+1",
    "4095",
    "4096",
    "4097",
    "65535",
    "65536",
    "1048576",
    "1048577",
    "4294967295",
    "4294967296",
    "4294967297",
    "4294967300",
    "8589934591",
    "8589934592",
    "8589934593",
    "2147483647",
    "2147483648",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "18446744073709551615",
    "18446744073709551616",
    "",
    " 1",
    "00000000000000000000001",
    "none",
    "zstd",
];

#[derive(Debug, Arbitrary)]
pub enum Edit {
    /// Replace the value of one of `KEYS` (added if the line is gone).
    Set(u8, Value),
    /// Set `segments=` to a fuzzer-made table.
    Segments(Vec<(u8, u32)>),
    RemoveLine(u8),
    DuplicateLine(u8),
    SwapLines(u8, u8),
    InsertLine(u8, String),
    ReplaceLine(u8, String),
    /// Put `header_crc32c=` somewhere other than last.
    CrcLineAt(u8),
    TruncateBody(u16),
    ExtendBody(Vec<u8>),
    FlipBody(u16, u8),
    /// Replace the bytes after the token ids.
    ReplacePayload(Vec<u8>),
    /// A zstd frame of `len` zero bytes as the payload (a highly compressible body).
    ZstdZeros(u32),
    /// Add this many distinct `kN=` lines (a long header; at most what fits in 64 KB).
    ManyKeys(u16),
}

#[derive(Debug, Arbitrary)]
pub enum Crc {
    /// Recompute it over the edited bytes.
    Fix,
    /// Keep what `encode` wrote.
    Keep,
    Set(u32),
}

/// Byte-level damage applied to the final file.
#[derive(Debug, Arbitrary)]
pub enum Raw {
    Flip(u16, u8),
    Truncate(u16),
    Insert(u16, u8),
    Remove(u16),
}

#[derive(Debug, Arbitrary)]
pub struct Plan {
    pub base: Base,
    pub edits: Vec<Edit>,
    pub body_crc: Crc,
    pub header_crc: Crc,
    pub raw: Vec<Raw>,
}

/// A header value `encode` can write: one line, bounded.
fn field(s: &str) -> String {
    s.chars().filter(|&c| c != '\n').take(MAX_STR).collect()
}

impl Base {
    /// The header, token ids and state of a valid snapshot.
    pub fn build(&self) -> (Header, Vec<i32>, Vec<u8>) {
        let mut segments = Vec::new();
        for (i, &(kind, len)) in self.segments.iter().take(MAX_SEGS).enumerate() {
            let kind = match kind % 3 {
                0 if i == 0 => SegKind::Base,
                0 | 1 => SegKind::Turn,
                _ => SegKind::Digest,
            };
            segments.push(Segment::new(kind, 1 + (len as u32 % 64)));
        }
        let tokens: u32 = segments.iter().map(|s| s.len).sum();
        let token_ids: Vec<i32> = (0..tokens as usize)
            .map(|i| {
                if self.token_ids.is_empty() {
                    i as i32
                } else {
                    self.token_ids[i % self.token_ids.len()]
                }
            })
            .collect();
        let state_len = self.state_len as usize % (MAX_STATE + 1);
        let state: Vec<u8> = if self.pattern.is_empty() {
            vec![0; state_len]
        } else {
            self.pattern
                .iter()
                .copied()
                .cycle()
                .take(state_len)
                .collect()
        };
        let header = Header {
            format_version: self.format_version.unwrap_or(snapshot::FORMAT_VERSION),
            model_sha: field(&self.model_sha),
            digest_version: field(&self.digest_version),
            crc32c: 0,
            tokens: 0,
            bytes: 0,
            stored_bytes: 0,
            timestamp: self.timestamp,
            llama_build: field(&self.llama_build),
            n_ctx: self.n_ctx,
            type_k: field(&self.type_k),
            type_v: field(&self.type_v),
            kv_device: field(&self.type_k),
            compression: if self.zstd {
                Compression::Zstd
            } else {
                Compression::None
            },
            scope: field(&self.scope),
            turn_id: self.turn_id,
            fence: self.fence,
            segments,
        };
        (header, token_ids, state)
    }
}

/// A file split into header lines (without the magic and `header_crc32c` lines) and body.
struct Parts {
    lines: Vec<String>,
    body: Vec<u8>,
    token_len: usize,
    header_crc: u32,
    crc_line_at: Option<usize>,
}

impl Parts {
    fn split(file: &[u8], tokens: u32) -> Parts {
        let end = file
            .windows(2)
            .position(|w| w == b"\n\n")
            .expect("encode wrote no blank line");
        let text = std::str::from_utf8(&file[..end]).expect("encode wrote non-UTF-8");
        let mut lines: Vec<String> = text.split('\n').skip(1).map(str::to_string).collect();
        let crc_line = lines.pop().expect("no header_crc32c line");
        let header_crc = crc_line
            .strip_prefix("header_crc32c=")
            .and_then(|v| v.parse().ok())
            .expect("bad header_crc32c line");
        Parts {
            lines,
            body: file[end + 2..].to_vec(),
            token_len: tokens as usize * 4,
            header_crc,
            crc_line_at: None,
        }
    }

    fn key_index(&self, key: &str) -> Option<usize> {
        self.lines
            .iter()
            .position(|l| l.split_once('=').map(|(k, _)| k) == Some(key))
    }

    fn value_of(&self, key: &str) -> Option<&str> {
        self.key_index(key)
            .and_then(|i| self.lines[i].split_once('='))
            .map(|(_, v)| v)
    }

    fn set(&mut self, key: &str, value: String) {
        let line = format!("{key}={value}");
        match self.key_index(key) {
            Some(i) => self.lines[i] = line,
            None => self.lines.push(line),
        }
    }

    fn pick(&self, i: u8) -> Option<usize> {
        (!self.lines.is_empty()).then(|| i as usize % self.lines.len())
    }

    fn apply(&mut self, edit: &Edit) {
        match edit {
            Edit::Set(k, value) => {
                let key = KEYS[*k as usize % KEYS.len()];
                let v = match value {
                    Value::Interesting(i) => INTERESTING[*i as usize % INTERESTING.len()].into(),
                    Value::U64(n) => n.to_string(),
                    Value::I64(n) => n.to_string(),
                    Value::Nudge(d) => {
                        let cur: i128 =
                            self.value_of(key).and_then(|v| v.parse().ok()).unwrap_or(0);
                        (cur + *d as i128).to_string()
                    }
                    Value::Text(t) => field(t),
                };
                self.set(key, v);
            }
            Edit::Segments(segs) => {
                let text = segs
                    .iter()
                    .take(MAX_SEGS)
                    .map(|&(k, n)| format!("{}:{n}", ['B', 'T', 'D', 'X'][k as usize % 4]))
                    .collect::<Vec<_>>()
                    .join(",");
                self.set("segments", text);
            }
            Edit::RemoveLine(i) => {
                if let Some(i) = self.pick(*i) {
                    self.lines.remove(i);
                }
            }
            Edit::DuplicateLine(i) => {
                if let Some(i) = self.pick(*i) {
                    let l = self.lines[i].clone();
                    self.lines.insert(i, l);
                }
            }
            Edit::SwapLines(a, b) => {
                if let (Some(a), Some(b)) = (self.pick(*a), self.pick(*b)) {
                    self.lines.swap(a, b);
                }
            }
            Edit::InsertLine(i, s) => {
                let at = *i as usize % (self.lines.len() + 1);
                self.lines.insert(at, field(s));
            }
            Edit::ReplaceLine(i, s) => {
                if let Some(i) = self.pick(*i) {
                    self.lines[i] = field(s);
                }
            }
            Edit::CrcLineAt(i) => self.crc_line_at = Some(*i as usize),
            Edit::TruncateBody(n) => {
                let n = *n as usize % (self.body.len() + 1);
                self.body.truncate(n);
            }
            Edit::ExtendBody(b) => self.body.extend(b.iter().take(256)),
            Edit::FlipBody(at, mask) => {
                if !self.body.is_empty() {
                    let at = *at as usize % self.body.len();
                    self.body[at] ^= mask | 1;
                }
            }
            Edit::ReplacePayload(p) => {
                self.body.truncate(self.token_len.min(self.body.len()));
                self.body.extend(p.iter().take(4096));
            }
            Edit::ZstdZeros(len) => {
                // Up to 256 KiB of zeros (a few blocks): tiny zstd, a large `bytes`.
                let len = *len as usize % (256 << 10);
                let frame = zstd::bulk::compress(&vec![0u8; len], 1).expect("zstd");
                self.body.truncate(self.token_len.min(self.body.len()));
                self.body.extend(frame);
            }
            Edit::ManyKeys(n) => {
                // ~9,400 such lines fill the 64 KB a header may have; stop a bit past that.
                let room = 10_000usize.saturating_sub(self.lines.len());
                for i in 0..(*n as usize % 16384).min(room) {
                    self.lines.push(format!("k{i}="));
                }
            }
        }
    }

    /// Reassembles the file; the CRCs per the plan.
    fn join(mut self, body_crc: &Crc, header_crc: &Crc) -> Vec<u8> {
        match body_crc {
            Crc::Fix => self.set("crc32c", crc32c::crc32c(&self.body).to_string()),
            Crc::Keep => {}
            Crc::Set(v) => self.set("crc32c", v.to_string()),
        }
        let mut text = String::from("LLKV1\n");
        let crc_line_at = self.crc_line_at.map(|i| i % (self.lines.len() + 1));
        for (i, l) in self.lines.iter().enumerate() {
            if crc_line_at == Some(i) {
                // Placeholder; real CRC is whatever precedes the last header_crc32c.
                text.push_str(&format!("header_crc32c={}\n", self.header_crc));
            }
            text.push_str(l);
            text.push('\n');
        }
        let crc = match header_crc {
            Crc::Fix => crc32c::crc32c(text.as_bytes()),
            Crc::Keep => self.header_crc,
            Crc::Set(v) => *v,
        };
        text.push_str(&format!("header_crc32c={crc}\n\n"));
        let mut out = text.into_bytes();
        out.extend_from_slice(&self.body);
        out
    }
}

/// Builds the plan's file. Also returns the valid snapshot it started from when the
/// plan changes nothing, so the caller can require an exact decode.
pub fn build(plan: &Plan) -> (Vec<u8>, Option<Snapshot>) {
    let (mut header, token_ids, state) = plan.base.build();
    let file = encode(&mut header, &token_ids, &state).expect("encode");
    let untouched = plan.edits.is_empty()
        && plan.raw.is_empty()
        && matches!(plan.body_crc, Crc::Fix | Crc::Keep)
        && matches!(plan.header_crc, Crc::Fix | Crc::Keep);
    let mut parts = Parts::split(&file, header.tokens);
    for edit in plan.edits.iter().take(8) {
        parts.apply(edit);
    }
    let mut out = parts.join(&plan.body_crc, &plan.header_crc);
    for raw in plan.raw.iter().take(4) {
        match *raw {
            Raw::Flip(at, mask) if !out.is_empty() => {
                let at = at as usize % out.len();
                out[at] ^= mask | 1;
            }
            Raw::Truncate(n) => {
                let n = n as usize % (out.len() + 1);
                out.truncate(n);
            }
            Raw::Insert(at, b) => {
                let at = at as usize % (out.len() + 1);
                out.insert(at, b);
            }
            Raw::Remove(at) if !out.is_empty() => {
                let at = at as usize % out.len();
                out.remove(at);
            }
            _ => {}
        }
    }
    let original = untouched.then(|| Snapshot {
        header,
        token_ids,
        state,
    });
    (out, original)
}

/// The structured target's check: no panic anywhere, an unedited snapshot decodes to
/// exactly what was encoded, and whatever decodes passes the `check_decode` invariants.
pub fn check_plan(plan: &Plan) {
    let (file, original) = build(plan);
    if let Some(orig) = original {
        for limits in LIMITS {
            let snap = decode(&file, limits)
                .unwrap_or_else(|e| panic!("a valid snapshot does not decode: {e}"));
            assert_eq!(snap.header, orig.header, "header changed by encode/decode");
            assert_eq!(snap.token_ids, orig.token_ids);
            assert!(snap.state == orig.state, "state changed by encode/decode");
        }
    }
    check_header(&file);
    check_decode(&file);
}

/// Valid LLKV1 files for the seed corpora: compressed and not, with and without segments.
pub fn seed_files() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut n = 0;
    for zstd in [false, true] {
        for (tag, segs) in [
            ("empty", vec![]),
            ("base", vec![(SegKind::Base, 3)]),
            (
                "turns",
                vec![
                    (SegKind::Base, 5),
                    (SegKind::Turn, 4),
                    (SegKind::Digest, 2),
                    (SegKind::Turn, 3),
                ],
            ),
            ("nobase", vec![(SegKind::Turn, 2), (SegKind::Digest, 1)]),
        ] {
            for state_len in [0usize, 37, 600] {
                let segments: Vec<Segment> = segs
                    .iter()
                    .map(|&(kind, len)| Segment::new(kind, len))
                    .collect();
                let tokens: u32 = segments.iter().map(|s| s.len).sum();
                let token_ids: Vec<i32> = (0..tokens as i32).map(|i| i * 7 - 3).collect();
                let state: Vec<u8> = (0..state_len).map(|i| (i % 13) as u8).collect();
                let mut h = Header {
                    format_version: snapshot::FORMAT_VERSION,
                    model_sha: "ab".repeat(32),
                    digest_version: if n % 2 == 0 {
                        String::new()
                    } else {
                        "cd".repeat(6)
                    },
                    crc32c: 0,
                    tokens: 0,
                    bytes: 0,
                    stored_bytes: 0,
                    timestamp: 1_700_000_000 + n,
                    llama_build: "b6500".into(),
                    n_ctx: 4096,
                    type_k: "f16".into(),
                    type_v: if zstd { "q8_0".into() } else { "f16".into() },
                    kv_device: if n % 2 == 0 {
                        snapshot::CPU_DEVICE.into()
                    } else {
                        "Vulkan0:30/30".into()
                    },
                    compression: if zstd {
                        Compression::Zstd
                    } else {
                        Compression::None
                    },
                    scope: format!("{:032x}", n * 0x1234_5678_9abc),
                    turn_id: n as i64 + 1,
                    fence: n as i64 * 3,
                    segments,
                };
                let file = encode(&mut h, &token_ids, &state).expect("encode");
                let name = format!(
                    "seed-{}-{tag}-{state_len}",
                    if zstd { "zstd" } else { "none" }
                );
                out.push((name, file));
                n += 1;
            }
        }
    }
    out
}

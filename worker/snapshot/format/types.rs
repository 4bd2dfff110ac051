//! The format's types and limits: segments, the header, the snapshot, its errors.

/// First line of every snapshot.
pub const MAGIC: &str = "LLKV1";
/// `kv_device` of a KV computed on the CPU, and of every file older than the key.
pub const CPU_DEVICE: &str = "CPU";
/// Bumped on any incompatible change to the layout.
pub const FORMAT_VERSION: u32 = 2;
/// A header is a few hundred bytes; anything this long is not a header.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;
/// More segments than this means a corrupt table (a turn is at least a few tokens).
pub(super) const MAX_SEGMENTS: usize = 1 << 16;
/// A real header has 19 lines; a file with many more is not one of ours.
pub(super) const MAX_HEADER_LINES: usize = 64;
/// The most a zstd payload can expand: a block of at least 4 bytes gives at most 128 KiB.
/// Bounding the output buffer by it means a tiny file can never reserve gigabytes.
pub(super) const MAX_ZSTD_RATIO: u64 = (128 * 1024) / 4;

/// What a segment of the KV holds; pruning and digest tracking work on these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegKind {
    /// The base system prompt, always the prefix and never pruned.
    Base,
    /// One exchange: the user message and the reply.
    Turn,
    /// An injected digest.
    Digest,
    /// An injected context block (user context, last session summary, spine); its tag is
    /// the context version, so a KV knows which version it has seen.
    Context,
    /// A recall block; its tag lists the recalled items (`m<memory id>`, `x<dialogue row
    /// id>`, `c<card hash>`), so the next turn injects only what the KV does not hold.
    Recall,
    /// The character's HUD line, kept as the KV's last segment after a save so the next
    /// turn's first token waits only for its message when the HUD has not changed. A KV
    /// holds at most one, and only at its end.
    Hud,
}

impl SegKind {
    pub(super) fn code(self) -> char {
        match self {
            SegKind::Base => 'B',
            SegKind::Turn => 'T',
            SegKind::Digest => 'D',
            SegKind::Context => 'C',
            SegKind::Recall => 'M',
            SegKind::Hud => 'H',
        }
    }

    pub(super) fn from_code(c: &str) -> Option<SegKind> {
        match c {
            "B" => Some(SegKind::Base),
            "T" => Some(SegKind::Turn),
            "D" => Some(SegKind::Digest),
            "C" => Some(SegKind::Context),
            "M" => Some(SegKind::Recall),
            "H" => Some(SegKind::Hud),
            _ => None,
        }
    }
}

/// A contiguous run of KV positions. Positions are implied: segments tile 0..tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    pub kind: SegKind,
    pub len: u32,
    /// What the segment carries, when that matters later: the turn id of an exchange, the
    /// version of a context block, the items of a recall block. Empty = nothing recorded.
    /// Only `[0-9A-Za-z.]`, so the table stays one comma-separated line.
    pub tag: String,
}

impl Segment {
    pub fn new(kind: SegKind, len: u32) -> Segment {
        Segment {
            kind,
            len,
            tag: String::new(),
        }
    }

    pub fn tagged(kind: SegKind, len: u32, tag: impl Into<String>) -> Segment {
        Segment {
            kind,
            len,
            tag: tag.into(),
        }
    }

    /// The recall items a recall segment holds (empty for any other kind).
    pub fn items(&self) -> impl Iterator<Item = &str> {
        let tag = if self.kind == SegKind::Recall {
            self.tag.as_str()
        } else {
            ""
        };
        tag.split('.').filter(|s| !s.is_empty())
    }
}

/// Whether `tag` can be written into a segment table.
pub fn valid_tag(tag: &str) -> bool {
    tag.len() <= MAX_TAG_BYTES && tag.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.')
}

/// A tag longer than this is not one of ours (a recall block holds a handful of items).
const MAX_TAG_BYTES: usize = 1024;

/// Payload encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Zstd,
}

/// Everything in the header. `crc32c`, `tokens`, `bytes` and `stored_bytes` are derived
/// from the body by [`super::encode`]; the rest describes what the state is valid for.
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
    /// The device the KV was computed on: `CPU`, or a GPU and how many of the KV's layers
    /// were on it (`Vulkan0:30/30`). The bytes' layout is the same on every device; their
    /// values are another device's arithmetic. Files written before the key existed were
    /// all made on the CPU and read as `CPU`.
    pub kv_device: String,
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

impl Header {
    /// A header for state made by one model and llama.cpp build under `scope`, with the
    /// defaults of a fresh session: no digest seen, no segments, uncompressed. The fields
    /// derived from the body (`crc32c`, `tokens`, `bytes`, `stored_bytes`) are [`super::encode`]'s.
    pub fn new(model_sha: &str, llama_build: &str, scope: &str) -> Header {
        Header {
            format_version: FORMAT_VERSION,
            model_sha: model_sha.to_string(),
            digest_version: String::new(),
            crc32c: 0,
            tokens: 0,
            bytes: 0,
            stored_bytes: 0,
            timestamp: 0,
            llama_build: llama_build.to_string(),
            n_ctx: 0,
            type_k: String::new(),
            type_v: String::new(),
            kv_device: CPU_DEVICE.to_string(),
            compression: Compression::None,
            scope: scope.to_string(),
            turn_id: 0,
            fence: 0,
            segments: Vec::new(),
        }
    }

    /// The context the state was made in: its size and the K/V cache type.
    pub fn with_kv(mut self, n_ctx: u32, kv_type: &str) -> Header {
        self.n_ctx = n_ctx;
        self.type_k = kv_type.to_string();
        self.type_v = kv_type.to_string();
        self
    }

    /// The device the KV was computed on (see [`Header::kv_device`]).
    pub fn with_kv_device(mut self, kv_device: &str) -> Header {
        self.kv_device = kv_device.to_string();
        self
    }

    /// The committed turn the KV ends with, and the fencing token of the attempt.
    pub fn with_turn(mut self, turn_id: i64, fence: i64) -> Header {
        self.turn_id = turn_id;
        self.fence = fence;
        self
    }

    pub fn with_digest(mut self, digest_version: &str) -> Header {
        self.digest_version = digest_version.to_string();
        self
    }

    pub fn with_segments(mut self, segments: Vec<Segment>) -> Header {
        self.segments = segments;
        self
    }

    pub fn with_compression(mut self, compression: Compression) -> Header {
        self.compression = compression;
        self
    }

    /// Unix seconds at save.
    pub fn with_timestamp(mut self, timestamp: u64) -> Header {
        self.timestamp = timestamp;
        self
    }
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

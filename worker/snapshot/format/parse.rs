//! Reading an untrusted LLKV1 file: every length and count checked against the file's
//! real size and the limits before anything is allocated, both CRCs verified.

use super::types::{
    valid_tag, Compression, Header, Limits, SegKind, Segment, Snapshot, SnapshotError, CPU_DEVICE,
    MAGIC, MAX_HEADER_BYTES, MAX_HEADER_LINES, MAX_SEGMENTS, MAX_ZSTD_RATIO,
};

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

    fn optional(&self, key: &str) -> Option<&'a str> {
        self.0.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
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
            // Optional: older files lack it, and older binaries skip it (they read only
            // the keys they know), so adding it needed no new format version.
            kv_device: self.optional("kv_device").unwrap_or(CPU_DEVICE).to_string(),
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

/// Parses `B:57,T:120@41,...`. The segments must tile exactly `tokens` positions, and
/// the base prompt, when present, must come first. Tables without tags (older files)
/// read as segments with empty tags.
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
        let (kind, rest) = item
            .split_once(':')
            .ok_or_else(|| SnapshotError::Malformed("segment without ':'".into()))?;
        let (len, tag) = rest.split_once('@').unwrap_or((rest, ""));
        if !valid_tag(tag) {
            return Err(SnapshotError::Malformed("segment tag unreadable".into()));
        }
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
        out.push(Segment::tagged(kind, len, tag));
    }
    if total != tokens as u64 {
        return Err(SnapshotError::Malformed(format!(
            "segments cover {total} tokens, header says {tokens}"
        )));
    }
    // The pipeline trusts a trailing HUD as the only one in the KV.
    let huds = out.iter().filter(|s| s.kind == SegKind::Hud).count();
    if huds > 1 || (huds == 1 && out.last().map(|s| s.kind) != Some(SegKind::Hud)) {
        return Err(SnapshotError::Malformed(
            "a HUD segment that is not the last".into(),
        ));
    }
    Ok(out)
}

//! Writing an LLKV1 file: the header's key=value lines with their CRC, then the token ids
//! and the (optionally zstd) state.

use std::io;

use super::types::{valid_tag, Compression, Header, Segment, MAGIC};

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

/// The segment table as the header writes it (`B:57,T:120@41,M:30@m12.x7,...`);
/// [`parse_segments`](super::parse_segments) reads it. Tags that could not be read back
/// are left out.
pub fn render_segments(segments: &[Segment]) -> String {
    let items: Vec<String> = segments
        .iter()
        .map(|s| {
            if s.tag.is_empty() || !valid_tag(&s.tag) {
                format!("{}:{}", s.kind.code(), s.len)
            } else {
                format!("{}:{}@{}", s.kind.code(), s.len, s.tag)
            }
        })
        .collect();
    items.join(",")
}

fn render_header(h: &Header) -> String {
    let compression = match h.compression {
        Compression::None => "none",
        Compression::Zstd => "zstd",
    };
    let mut text = format!(
        "{MAGIC}\nformat_version={}\nmodel_sha={}\ndigest_version={}\ncrc32c={}\ntokens={}\n\
         bytes={}\nstored_bytes={}\ntimestamp={}\nllama_build={}\nn_ctx={}\ntype_k={}\n\
         type_v={}\nkv_device={}\ncompression={}\nscope={}\nturn_id={}\nfence={}\nsegments={}\n",
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
        h.kv_device,
        compression,
        h.scope,
        h.turn_id,
        h.fence,
        render_segments(&h.segments)
    );
    let crc = crc32c::crc32c(text.as_bytes());
    text.push_str(&format!("header_crc32c={crc}\n\n"));
    text
}

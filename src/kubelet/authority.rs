//! Rewrites the client-to-server half of an HTTP/2 connection so that every request reaches
//! the server with an `:authority` the `http` crate accepts.
//!
//! Why: kubelet (grpc-go) dials plugin sockets by their bare path and then sends that path,
//! percent-encoded, as `:authority` (`%2Fvar%2Flib%2Fkubelet%2F…-reg.sock`). `http::uri::Authority`
//! rejects `%` and `/` there, so `h2` resets the stream with `PROTOCOL_ERROR` before tonic sees
//! the request (kubernetes/kubernetes#108254). See `docs/decisions/0001-kubelet-authority.md`.
//!
//! How: [`ClientStreamRewriter`] is a pure byte transformer (no I/O). It passes the connection
//! preface and every frame through untouched, except header blocks (`HEADERS` plus its
//! `CONTINUATION`s): those are reassembled, decoded with an HPACK decoder (`httlib-hpack`) that
//! mirrors the client's encoder (dynamic table, size updates, Huffman), the authority is replaced by
//! `localhost` when `http` would reject it, and the block is re-encoded with literals that are
//! never indexed. Because *every* block is re-encoded that way, the server's HPACK dynamic table
//! stays empty and can never disagree with the client's. Padding is dropped, the priority
//! fields and `END_STREAM` are kept, and the new block is split into frames of at most 16 384
//! bytes (the smallest `SETTINGS_MAX_FRAME_SIZE` a peer may advertise, so always acceptable).
//! The server-to-client half is not touched at all.

use bytes::{Buf, BufMut, BytesMut};
use httlib_hpack::{Decoder, DecoderError};

/// The client connection preface (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Length of an HTTP/2 frame header.
const FRAME_HEADER_LEN: usize = 9;
/// Largest frame payload we emit: the minimum value of `SETTINGS_MAX_FRAME_SIZE`.
const MAX_EMITTED_PAYLOAD: usize = 16_384;
/// Bound on one encoded header block (all fragments); kubelet's blocks are a few hundred bytes.
pub(crate) const MAX_HEADER_BLOCK: usize = 64 * 1024;
/// Bound on one decoded header list (RFC 7541 §4.1 sizes: name + value + 32 per field): four
/// times the 16 KiB `SETTINGS_MAX_HEADER_LIST_SIZE` that hyper's server (under tonic)
/// advertises, so every list the server would accept gets through.
pub(crate) const MAX_DECODED_HEADER_LIST: usize = 64 * 1024;
/// Largest dynamic table the client may announce in a size update: the server's
/// `SETTINGS_HEADER_TABLE_SIZE`, which h2 leaves at the protocol default and tonic does not
/// change.
const MAX_DYNAMIC_TABLE: u32 = 4096;
/// What an unusable authority is replaced with (what grpc-go sends for `unix:` targets).
pub(crate) const REPLACEMENT_AUTHORITY: &[u8] = b"localhost";

/// The first octet of a dynamic table size update is `001xxxxx` (RFC 7541 §6.3).
const SIZE_UPDATE_MASK: u8 = 0xe0;
const SIZE_UPDATE_PATTERN: u8 = 0x20;

const FRAME_HEADERS: u8 = 0x1;
const FRAME_PUSH_PROMISE: u8 = 0x5;
const FRAME_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;

/// Why the client half of a connection could not be rewritten; the connection is then closed
/// (the HTTP/2 server would have treated each case as a connection error too).
#[derive(Debug, thiserror::Error)]
pub enum AuthorityRewriteError {
    /// A frame violates HTTP/2 framing rules (RFC 9113 §4–§6).
    #[error("malformed HTTP/2 frame (type {frame_type:#x}, stream {stream_id}): {reason}")]
    MalformedFrame {
        /// Frame type octet.
        frame_type: u8,
        /// Stream identifier of the frame.
        stream_id: u32,
        /// Which rule it broke.
        reason: &'static str,
    },
    /// A header block was not followed by its `CONTINUATION` frames (RFC 9113 §6.10).
    #[error(
        "expected CONTINUATION for stream {expected_stream}, got frame type {frame_type:#x} on stream {stream_id}"
    )]
    InterruptedHeaderBlock {
        /// Stream whose header block was still open.
        expected_stream: u32,
        /// Type of the frame that arrived instead.
        frame_type: u8,
        /// Its stream.
        stream_id: u32,
    },
    /// A header block exceeded `MAX_HEADER_BLOCK` encoded or `MAX_DECODED_HEADER_LIST`
    /// decoded bytes.
    #[error("header block on stream {stream_id} exceeds {limit} bytes")]
    HeaderBlockTooLarge {
        /// Stream of the block.
        stream_id: u32,
        /// The limit that was exceeded.
        limit: usize,
    },
    /// The HPACK decoder rejected a header block (RFC 7541 decoding error).
    #[error("cannot decode HPACK header block on stream {stream_id}: {source}")]
    Hpack {
        /// Stream of the block.
        stream_id: u32,
        /// What the decoder reported.
        #[source]
        source: DecoderError,
    },
}

/// Where the rewriter is in the client's byte stream.
#[derive(Debug)]
enum Position {
    /// Still inside the 24-byte connection preface; `matched` bytes of it seen.
    Preface { matched: usize },
    /// At a frame boundary (or with an incomplete frame header or header-frame payload buffered).
    FrameStart,
    /// Copying the payload of a frame that passes through untouched.
    Forwarding { remaining: usize },
    /// The stream did not start with the HTTP/2 preface: pass everything through unchanged
    /// and let the server reject it.
    Opaque,
}

/// A `HEADERS` frame waiting for its `CONTINUATION`s.
#[derive(Debug)]
struct OpenHeaderBlock {
    stream_id: u32,
    end_stream: bool,
    /// Exclusive flag + stream dependency + weight, when the `HEADERS` frame had `PRIORITY`.
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
}

/// Transforms the client-to-server bytes of one HTTP/2 connection (see the module docs).
pub struct ClientStreamRewriter {
    position: Position,
    decoder: Decoder<'static>,
    open_block: Option<OpenHeaderBlock>,
    rewritten_authorities: u64,
}

impl std::fmt::Debug for ClientStreamRewriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientStreamRewriter")
            .field("position", &self.position)
            .field("open_block", &self.open_block)
            .field("rewritten_authorities", &self.rewritten_authorities)
            .finish_non_exhaustive()
    }
}

impl Default for ClientStreamRewriter {
    fn default() -> Self {
        Self::new()
    }
}

impl ClientStreamRewriter {
    /// A rewriter for a fresh connection (expects the client preface first).
    #[must_use]
    pub fn new() -> Self {
        Self {
            position: Position::Preface { matched: 0 },
            decoder: Decoder::with_dynamic_size(MAX_DYNAMIC_TABLE),
            open_block: None,
            rewritten_authorities: 0,
        }
    }

    /// How many `:authority` values were replaced so far on this connection.
    #[must_use]
    pub fn rewritten_authorities(&self) -> u64 {
        self.rewritten_authorities
    }

    /// Moves every byte of `input` that can be handled now to `output`, rewriting header
    /// blocks. Bytes of an incomplete frame header or header frame stay in `input` until more
    /// arrive. Call again after appending to `input`.
    pub fn process(
        &mut self,
        input: &mut BytesMut,
        output: &mut BytesMut,
    ) -> Result<(), AuthorityRewriteError> {
        loop {
            match self.position {
                Position::Opaque => {
                    output.extend_from_slice(&input.split());
                    return Ok(());
                }
                Position::Preface { matched } => {
                    let take = input.len().min(PREFACE.len() - matched);
                    if take == 0 {
                        return Ok(());
                    }
                    if input[..take] != PREFACE[matched..matched + take] {
                        self.position = Position::Opaque;
                        continue;
                    }
                    output.extend_from_slice(&input.split_to(take));
                    let matched = matched + take;
                    self.position = if matched == PREFACE.len() {
                        Position::FrameStart
                    } else {
                        Position::Preface { matched }
                    };
                }
                Position::Forwarding { remaining } => {
                    let take = input.len().min(remaining);
                    if take == 0 {
                        return Ok(());
                    }
                    output.extend_from_slice(&input.split_to(take));
                    self.position = if take == remaining {
                        Position::FrameStart
                    } else {
                        Position::Forwarding { remaining: remaining - take }
                    };
                }
                Position::FrameStart => {
                    if !self.next_frame(input, output)? {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// Handles the frame at the start of `input`. Returns false when more bytes are needed.
    fn next_frame(
        &mut self,
        input: &mut BytesMut,
        output: &mut BytesMut,
    ) -> Result<bool, AuthorityRewriteError> {
        if input.len() < FRAME_HEADER_LEN {
            return Ok(false);
        }
        let length =
            usize::from(input[0]) << 16 | usize::from(input[1]) << 8 | usize::from(input[2]);
        let frame_type = input[3];
        let flags = input[4];
        let stream_id = u32::from_be_bytes([input[5], input[6], input[7], input[8]]) & 0x7fff_ffff;

        if let Some(open) = &self.open_block
            && (frame_type != FRAME_CONTINUATION || stream_id != open.stream_id)
        {
            return Err(AuthorityRewriteError::InterruptedHeaderBlock {
                expected_stream: open.stream_id,
                frame_type,
                stream_id,
            });
        }

        match frame_type {
            FRAME_HEADERS | FRAME_CONTINUATION => {
                if length > MAX_HEADER_BLOCK {
                    return Err(AuthorityRewriteError::HeaderBlockTooLarge {
                        stream_id,
                        limit: MAX_HEADER_BLOCK,
                    });
                }
                if input.len() < FRAME_HEADER_LEN + length {
                    input.reserve(FRAME_HEADER_LEN + length - input.len());
                    return Ok(false);
                }
                input.advance(FRAME_HEADER_LEN);
                let payload = input.split_to(length);
                if frame_type == FRAME_HEADERS {
                    self.open_headers(flags, stream_id, &payload)?;
                } else {
                    self.continue_headers(stream_id, &payload)?;
                }
                if flags & FLAG_END_HEADERS != 0 {
                    self.close_header_block(output)?;
                }
            }
            FRAME_PUSH_PROMISE => {
                // Only servers push (RFC 9113 §8.4); its header block would also bypass our
                // HPACK mirror, so refuse it here.
                return Err(AuthorityRewriteError::MalformedFrame {
                    frame_type,
                    stream_id,
                    reason: "PUSH_PROMISE sent by a client",
                });
            }
            _ => {
                output.extend_from_slice(&input.split_to(FRAME_HEADER_LEN));
                if length > 0 {
                    self.position = Position::Forwarding { remaining: length };
                }
            }
        }
        Ok(true)
    }

    fn open_headers(
        &mut self,
        flags: u8,
        stream_id: u32,
        payload: &[u8],
    ) -> Result<(), AuthorityRewriteError> {
        let malformed = |reason| AuthorityRewriteError::MalformedFrame {
            frame_type: FRAME_HEADERS,
            stream_id,
            reason,
        };
        if stream_id == 0 {
            return Err(malformed("HEADERS on stream 0"));
        }
        let mut body = payload;
        let mut pad_len = 0;
        if flags & FLAG_PADDED != 0 {
            let (&len, rest) = body.split_first().ok_or(malformed("PADDED without pad length"))?;
            pad_len = usize::from(len);
            body = rest;
        }
        let mut priority = None;
        if flags & FLAG_PRIORITY != 0 {
            let (fields, rest) =
                body.split_first_chunk::<5>().ok_or(malformed("PRIORITY fields truncated"))?;
            priority = Some(*fields);
            body = rest;
        }
        if pad_len > body.len() {
            return Err(malformed("padding longer than the payload"));
        }
        let fragment = &body[..body.len() - pad_len];
        self.open_block = Some(OpenHeaderBlock {
            stream_id,
            end_stream: flags & FLAG_END_STREAM != 0,
            priority,
            fragment: fragment.to_vec(),
        });
        Ok(())
    }

    fn continue_headers(
        &mut self,
        stream_id: u32,
        payload: &[u8],
    ) -> Result<(), AuthorityRewriteError> {
        let Some(open) = self.open_block.as_mut() else {
            return Err(AuthorityRewriteError::MalformedFrame {
                frame_type: FRAME_CONTINUATION,
                stream_id,
                reason: "CONTINUATION without an open header block",
            });
        };
        if open.fragment.len() + payload.len() > MAX_HEADER_BLOCK {
            return Err(AuthorityRewriteError::HeaderBlockTooLarge {
                stream_id,
                limit: MAX_HEADER_BLOCK,
            });
        }
        open.fragment.extend_from_slice(payload);
        Ok(())
    }

    /// Decodes the completed block, fixes the authority and emits the re-encoded frames.
    fn close_header_block(&mut self, output: &mut BytesMut) -> Result<(), AuthorityRewriteError> {
        let Some(block) = self.open_block.take() else {
            return Ok(());
        };
        let stream_id = block.stream_id;

        // The decoder drains `remaining`; `block.fragment` keeps each representation's bytes
        // for the Huffman check below.
        let mut remaining = block.fragment.clone();
        let mut encoded = Vec::with_capacity(remaining.len() + 64);
        let mut decoded_size = 0_usize;
        let mut rewritten = false;
        let mut rewritten_fields = 0_usize;
        // One representation at a time (the capacity of `fields` bounds how many the decoder
        // takes per call), so an oversized list is refused before it is materialised.
        let mut fields = Vec::with_capacity(1);
        while !remaining.is_empty() {
            let before = remaining.len();
            // A dynamic table size update may only open a header block (RFC 7541 §4.2), and
            // h2 refuses one after a field. httlib-hpack 0.1.3 applies it anywhere, and the
            // re-encoded block would hide it from the server, so it is refused here.
            if rewritten_fields > 0 && remaining[0] & SIZE_UPDATE_MASK == SIZE_UPDATE_PATTERN {
                return Err(AuthorityRewriteError::Hpack {
                    stream_id,
                    source: DecoderError::InvalidMaxDynamicSize,
                });
            }
            // httlib-hpack 0.1.3 indexes past the end of a block that stops inside a literal
            // representation (a name index with no value string after it): it panics instead
            // of returning an error. Such a block is refused like any undecodable one; the
            // connection ends with it, so the decoder's state after the panic is never used.
            let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.decoder.decode_exact(&mut remaining, &mut fields)
            }))
            .unwrap_or(Err(DecoderError::InvalidInput));
            decoded.map_err(|source| AuthorityRewriteError::Hpack { stream_id, source })?;
            if remaining.len() == before {
                return Err(AuthorityRewriteError::Hpack {
                    stream_id,
                    source: DecoderError::InvalidInput,
                });
            }
            let start = block.fragment.len() - before;
            let representation = &block.fragment[start..block.fragment.len() - remaining.len()];
            for (name, value, _flags) in fields.drain(..) {
                rewritten_fields += 1;
                if !huffman_strings_are_canonical(representation, &name, &value) {
                    return Err(AuthorityRewriteError::Hpack {
                        stream_id,
                        source: DecoderError::InvalidInput,
                    });
                }
                decoded_size = decoded_size.saturating_add(name.len() + value.len() + 32);
                if decoded_size > MAX_DECODED_HEADER_LIST {
                    return Err(AuthorityRewriteError::HeaderBlockTooLarge {
                        stream_id,
                        limit: MAX_DECODED_HEADER_LIST,
                    });
                }
                let value: &[u8] = if name == b":authority" && !is_acceptable_authority(&value) {
                    rewritten = true;
                    tracing::debug!(
                        stream_id,
                        authority = %String::from_utf8_lossy(&value),
                        "replacing an :authority the http crate rejects with localhost"
                    );
                    REPLACEMENT_AUTHORITY
                } else {
                    &value
                };
                encode_never_indexed(&name, value, &mut encoded);
            }
        }
        if rewritten {
            self.rewritten_authorities += 1;
        }

        let mut first_flags = 0;
        let mut first_prefix: &[u8] = &[];
        if block.end_stream {
            first_flags |= FLAG_END_STREAM;
        }
        if let Some(priority) = &block.priority {
            first_flags |= FLAG_PRIORITY;
            first_prefix = priority;
        }
        let first_room = MAX_EMITTED_PAYLOAD - first_prefix.len();
        let (first, mut rest) = encoded.split_at(encoded.len().min(first_room));
        let first_end = if rest.is_empty() { FLAG_END_HEADERS } else { 0 };
        put_frame_header(
            output,
            first_prefix.len() + first.len(),
            FRAME_HEADERS,
            first_flags | first_end,
            stream_id,
        );
        output.extend_from_slice(first_prefix);
        output.extend_from_slice(first);
        while !rest.is_empty() {
            let (chunk, tail) = rest.split_at(rest.len().min(MAX_EMITTED_PAYLOAD));
            let end = if tail.is_empty() { FLAG_END_HEADERS } else { 0 };
            put_frame_header(output, chunk.len(), FRAME_CONTINUATION, end, stream_id);
            output.extend_from_slice(chunk);
            rest = tail;
        }
        Ok(())
    }
}

/// Whether the `http` crate (hence h2 and tonic) accepts `value` as a request authority.
#[must_use]
pub fn is_acceptable_authority(value: &[u8]) -> bool {
    http::uri::Authority::try_from(value).is_ok()
}

/// Whether each Huffman-coded string of the literal field `representation` is the one
/// encoding of what it decoded to (`name`, `value`). RFC 7541 §5.2 makes padding longer
/// than 7 bits or not all ones a decoding error, and h2 ends the connection on it;
/// httlib-hpack 0.1.3 accepts any padding, and the re-encoded block would hide it from the
/// server. A Huffman code is prefix-free and its padding fixed, so a string is valid exactly
/// when encoding its decoded bytes gives it back. Indexed fields and size updates hold no
/// strings.
fn huffman_strings_are_canonical(representation: &[u8], name: &[u8], value: &[u8]) -> bool {
    let Some(&first) = representation.first() else {
        return true;
    };
    if first & 0x80 != 0 || first & SIZE_UPDATE_MASK == SIZE_UPDATE_PATTERN {
        return true;
    }
    // Literal with incremental indexing: 6-bit name index; the other literals: 4-bit.
    let prefix_bits = if first & 0x40 != 0 { 6 } else { 4 };
    let Some((name_index, mut at)) = decode_integer(representation, prefix_bits) else {
        return false;
    };
    let strings: &[&[u8]] = if name_index == 0 { &[name, value] } else { &[value] };
    for decoded in strings {
        let Some(rest) = representation.get(at..) else {
            return false;
        };
        let Some((len, used)) = decode_integer(rest, 7) else {
            return false;
        };
        let Some(raw) = rest.get(used..used + len) else {
            return false;
        };
        if rest[0] & 0x80 != 0 {
            let mut canonical = Vec::with_capacity(len);
            if httlib_huffman::encode(decoded, &mut canonical).is_err() || canonical != raw {
                return false;
            }
        }
        at += used + len;
    }
    true
}

/// An integer with an N-bit prefix (RFC 7541 §5.1) at the start of `bytes`: its value and
/// how many bytes it took. `None` when it is cut off or longer than the decoder accepts.
fn decode_integer(bytes: &[u8], prefix_bits: u8) -> Option<(usize, usize)> {
    let max_prefix = (1_usize << prefix_bits) - 1;
    let first = usize::from(*bytes.first()?) & max_prefix;
    if first < max_prefix {
        return Some((first, 1));
    }
    let mut value = max_prefix;
    for (i, &byte) in bytes.iter().enumerate().skip(1).take(4) {
        value += usize::from(byte & 0x7f) << (7 * (i - 1));
        if byte & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

/// Appends one "literal header field never indexed, new name" representation (RFC 7541
/// §6.2.3) without Huffman coding. Never-indexed keeps the strongest hint a client may have
/// given for this field and leaves the receiver's dynamic table untouched.
fn encode_never_indexed(name: &[u8], value: &[u8], out: &mut Vec<u8>) {
    out.push(0x10);
    encode_string(name, out);
    encode_string(value, out);
}

/// A string literal without Huffman coding (RFC 7541 §5.2): H = 0, 7-bit prefix length.
fn encode_string(bytes: &[u8], out: &mut Vec<u8>) {
    encode_integer(bytes.len(), 7, 0, out);
    out.extend_from_slice(bytes);
}

/// An integer with an N-bit prefix (RFC 7541 §5.1); `flags` fills the bits above the prefix.
fn encode_integer(value: usize, prefix_bits: u8, flags: u8, out: &mut Vec<u8>) {
    let max_prefix = (1_usize << prefix_bits) - 1;
    if value < max_prefix {
        // Fits the prefix: `value < 2^prefix_bits ≤ 128`.
        out.push(flags | u8::try_from(value).unwrap_or(u8::MAX));
        return;
    }
    out.push(flags | u8::try_from(max_prefix).unwrap_or(u8::MAX));
    let mut rest = value - max_prefix;
    while rest >= 0x80 {
        out.push(0x80 | u8::try_from(rest & 0x7f).unwrap_or(0));
        rest >>= 7;
    }
    out.push(u8::try_from(rest).unwrap_or(0));
}

fn put_frame_header(out: &mut BytesMut, length: usize, frame_type: u8, flags: u8, stream_id: u32) {
    debug_assert!(length <= MAX_EMITTED_PAYLOAD, "frame payload fits the minimum max size");
    let length = u32::try_from(length).unwrap_or(u32::MAX);
    out.put_slice(&length.to_be_bytes()[1..]);
    out.put_u8(frame_type);
    out.put_u8(flags);
    out.put_u32(stream_id & 0x7fff_ffff);
}

#[cfg(test)]
#[path = "authority_props.rs"]
mod props;

#[cfg(test)]
mod tests {
    use super::*;
    use httlib_hpack::Encoder;

    type HeaderList = Vec<(Vec<u8>, Vec<u8>)>;

    /// "Indexed header field" representation of index 62, the first dynamic-table entry.
    const INDEXED_62: u8 = 0x80 | 0x3e;

    fn frame(frame_type: u8, flags: u8, stream_id: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = BytesMut::new();
        put_frame_header(&mut out, 0, frame_type, flags, stream_id);
        let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
        out[..3].copy_from_slice(&len[1..]);
        out.extend_from_slice(payload);
        out.to_vec()
    }

    fn request_headers(authority: &[u8]) -> HeaderList {
        vec![
            (b":method".to_vec(), b"POST".to_vec()),
            (b":scheme".to_vec(), b"http".to_vec()),
            (b":path".to_vec(), b"/pluginregistration.Registration/GetInfo".to_vec()),
            (b":authority".to_vec(), authority.to_vec()),
            (b"content-type".to_vec(), b"application/grpc".to_vec()),
            (b"te".to_vec(), b"trailers".to_vec()),
        ]
    }

    /// Encodes like grpc-go: Huffman strings, incremental indexing, table references.
    fn encode(encoder: &mut Encoder<'_>, headers: &HeaderList) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, value) in headers {
            let flags = Encoder::HUFFMAN_NAME
                | Encoder::HUFFMAN_VALUE
                | Encoder::WITH_INDEXING
                | Encoder::BEST_FORMAT;
            encoder.encode((name.clone(), value.clone(), flags), &mut out).unwrap();
        }
        out
    }

    /// Parses the rewriter's output frames; decodes header blocks with a fresh decoder that
    /// plays the server (its table must never be needed).
    struct ServerView {
        decoder: Decoder<'static>,
        frames: Vec<(u8, u8, u32, Vec<u8>)>,
        header_lists: Vec<HeaderList>,
    }

    fn server_view(mut bytes: &[u8]) -> ServerView {
        assert!(bytes.starts_with(PREFACE));
        bytes = &bytes[PREFACE.len()..];
        let mut view =
            ServerView { decoder: Decoder::default(), frames: vec![], header_lists: vec![] };
        let mut block = Vec::new();
        while !bytes.is_empty() {
            let len =
                usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
            let (ty, flags) = (bytes[3], bytes[4]);
            let sid = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]);
            let payload = bytes[9..9 + len].to_vec();
            bytes = &bytes[9 + len..];
            if ty == FRAME_HEADERS || ty == FRAME_CONTINUATION {
                assert!(len <= MAX_EMITTED_PAYLOAD);
                let skip = if ty == FRAME_HEADERS && flags & FLAG_PRIORITY != 0 { 5 } else { 0 };
                assert_eq!(flags & FLAG_PADDED, 0, "padding is dropped");
                block.extend_from_slice(&payload[skip..]);
                if flags & FLAG_END_HEADERS != 0 {
                    let mut fields = Vec::new();
                    view.decoder.decode(&mut block, &mut fields).unwrap();
                    assert!(fields.iter().all(|f| f.2 == Decoder::NEVER_INDEXED));
                    view.header_lists.push(fields.into_iter().map(|(n, v, _)| (n, v)).collect());
                }
            }
            view.frames.push((ty, flags, sid, payload));
        }
        // Every emitted field is never-indexed, so the server-side table stays empty.
        let err = view.decoder.decode(&mut vec![INDEXED_62], &mut Vec::new()).unwrap_err();
        assert_eq!(err, DecoderError::InvalidIndex);
        view
    }

    fn run(input: &[u8]) -> (ClientStreamRewriter, Vec<u8>) {
        let mut rewriter = ClientStreamRewriter::new();
        let mut inbuf = BytesMut::from(input);
        let mut out = BytesMut::new();
        rewriter.process(&mut inbuf, &mut out).unwrap();
        assert!(inbuf.is_empty(), "all input consumed");
        (rewriter, out.to_vec())
    }

    #[test]
    fn string_lengths_at_prefix_boundaries_round_trip() {
        for len in [0, 1, 126, 127, 128, 254, 255, 16_383, 16_384, 40_000] {
            let value = vec![b'v'; len];
            let mut block = Vec::new();
            encode_never_indexed(b"x-len", &value, &mut block);
            let mut fields = Vec::new();
            Decoder::default().decode(&mut block, &mut fields).unwrap();
            assert_eq!(fields, vec![(b"x-len".to_vec(), value, Decoder::NEVER_INDEXED)], "{len}");
        }
    }

    #[test]
    fn percent_encoded_socket_path_is_not_an_acceptable_authority() {
        assert!(!is_acceptable_authority(
            b"%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fx-reg.sock"
        ));
        assert!(!is_acceptable_authority(b"/var/lib/kubelet/plugins/x/dra.sock"));
        assert!(is_acceptable_authority(b"localhost"));
        assert!(is_acceptable_authority(b"example.com:443"));
    }

    #[test]
    fn percent_encoded_authority_is_replaced_and_other_headers_kept() {
        let mut encoder = Encoder::default();
        let headers = request_headers(b"%2Ftmp%2Fx%2Freg.sock");
        let mut input = PREFACE.to_vec();
        input.extend(frame(0x4, 0, 0, &[])); // SETTINGS
        input.extend(frame(FRAME_HEADERS, FLAG_END_HEADERS, 1, &encode(&mut encoder, &headers)));
        input.extend(frame(0x0, FLAG_END_STREAM, 1, b"\0\0\0\0\0")); // DATA
        let (rewriter, out) = run(&input);
        let view = server_view(&out);
        let mut expected = headers.clone();
        expected[3].1 = b"localhost".to_vec();
        assert_eq!(view.header_lists, vec![expected]);
        assert_eq!(rewriter.rewritten_authorities(), 1);
        assert_eq!(view.frames[0], (0x4, 0, 0, vec![]));
        assert_eq!(view.frames[2], (0x0, FLAG_END_STREAM, 1, b"\0\0\0\0\0".to_vec()));
    }

    #[test]
    fn valid_authority_is_left_alone() {
        let mut encoder = Encoder::default();
        let headers = request_headers(b"localhost:50051");
        let mut input = PREFACE.to_vec();
        input.extend(frame(
            FRAME_HEADERS,
            FLAG_END_HEADERS | FLAG_END_STREAM,
            1,
            &encode(&mut encoder, &headers),
        ));
        let (rewriter, out) = run(&input);
        let view = server_view(&out);
        assert_eq!(view.header_lists, vec![headers]);
        assert_eq!(rewriter.rewritten_authorities(), 0);
        assert_eq!(view.frames[0].1, FLAG_END_HEADERS | FLAG_END_STREAM);
    }

    #[test]
    fn dynamic_table_references_of_later_requests_are_resolved() {
        // The client's encoder indexes the first block's fields; the second block is then
        // mostly table references that only our mirror decoder can resolve.
        let mut encoder = Encoder::default();
        let first = request_headers(b"%2Fsock");
        let mut second = request_headers(b"%2Fsock");
        second[2].1 = b"/pluginregistration.Registration/NotifyRegistrationStatus".to_vec();
        let block2 = encode(&mut encoder, &first);
        let block3 = encode(&mut encoder, &second);
        // An indexed field (high bit) with a one-byte index of 62 or more is a table reference.
        assert!(
            block3.iter().any(|b| (INDEXED_62..0xff).contains(b)),
            "second block references the dynamic table"
        );
        let mut input = PREFACE.to_vec();
        input.extend(frame(FRAME_HEADERS, FLAG_END_HEADERS, 1, &block2));
        input.extend(frame(FRAME_HEADERS, FLAG_END_HEADERS, 3, &block3));
        let (rewriter, out) = run(&input);
        let view = server_view(&out);
        assert_eq!(view.header_lists.len(), 2);
        assert_eq!(view.header_lists[1][2].1, second[2].1);
        assert_eq!(view.header_lists[1][3].1, b"localhost");
        assert_eq!(rewriter.rewritten_authorities(), 2);
    }

    #[test]
    fn padding_priority_and_continuation_are_handled() {
        let mut encoder = Encoder::default();
        let headers = request_headers(b"%2Fsock");
        let block = encode(&mut encoder, &headers);
        let (a, rest) = block.split_at(10);
        let (b, c) = rest.split_at(20);
        let mut headers_payload = vec![3]; // pad length
        headers_payload.extend([0x80, 0, 0, 0, 7]); // exclusive, depends on 0, weight 7
        headers_payload.extend(a);
        headers_payload.extend([0, 0, 0]);
        let mut input = PREFACE.to_vec();
        input.extend(frame(
            FRAME_HEADERS,
            FLAG_PADDED | FLAG_PRIORITY | FLAG_END_STREAM,
            5,
            &headers_payload,
        ));
        input.extend(frame(FRAME_CONTINUATION, 0, 5, b));
        input.extend(frame(FRAME_CONTINUATION, FLAG_END_HEADERS, 5, c));
        let (_, out) = run(&input);
        let view = server_view(&out);
        assert_eq!(view.header_lists[0][3].1, b"localhost");
        let (ty, flags, sid, payload) = &view.frames[0];
        assert_eq!((*ty, *sid), (FRAME_HEADERS, 5));
        assert_eq!(*flags, FLAG_PRIORITY | FLAG_END_STREAM | FLAG_END_HEADERS);
        assert_eq!(&payload[..5], &[0x80, 0, 0, 0, 7]);
    }

    #[test]
    fn large_blocks_are_split_into_frames_of_at_most_16k() {
        let mut encoder = Encoder::default();
        let mut headers = request_headers(b"%2Fsock");
        headers.push((b"x-big".to_vec(), vec![b'a'; 40_000]));
        let block = encode(&mut encoder, &headers);
        let mut input = PREFACE.to_vec();
        input.extend(frame(FRAME_HEADERS, 0, 1, &block[..16_000]));
        input.extend(frame(FRAME_CONTINUATION, FLAG_END_HEADERS, 1, &block[16_000..]));
        let (_, out) = run(&input);
        let view = server_view(&out);
        assert_eq!(view.header_lists[0][6].1.len(), 40_000);
        let types: Vec<u8> = view.frames.iter().map(|f| f.0).collect();
        assert_eq!(types, vec![FRAME_HEADERS, FRAME_CONTINUATION, FRAME_CONTINUATION]);
    }

    #[test]
    fn input_arriving_byte_by_byte_gives_the_same_output() {
        let mut encoder = Encoder::default();
        let mut input = PREFACE.to_vec();
        input.extend(frame(0x4, 0, 0, &[0, 4, 0, 0, 0xff, 0xff]));
        input.extend(frame(
            FRAME_HEADERS,
            FLAG_END_HEADERS,
            1,
            &encode(&mut encoder, &request_headers(b"%2Fs")),
        ));
        input.extend(frame(0x0, FLAG_END_STREAM, 1, &[1; 300]));
        let (_, whole) = run(&input);
        let mut rewriter = ClientStreamRewriter::new();
        let mut inbuf = BytesMut::new();
        let mut out = BytesMut::new();
        for byte in &input {
            inbuf.put_u8(*byte);
            rewriter.process(&mut inbuf, &mut out).unwrap();
        }
        assert!(inbuf.is_empty());
        assert_eq!(out.to_vec(), whole);
    }

    #[test]
    fn table_size_update_from_client_is_applied_to_the_mirror() {
        // A size update to 0 evicts everything: a later reference to index 62 must fail,
        // exactly as it would in the real server decoder.
        let mut encoder = Encoder::default();
        let block = encode(&mut encoder, &request_headers(b"%2Fs"));
        let mut input = PREFACE.to_vec();
        input.extend(frame(FRAME_HEADERS, FLAG_END_HEADERS, 1, &block));
        let mut second = vec![0x20]; // size update to 0
        second.push(INDEXED_62);
        input.extend(frame(FRAME_HEADERS, FLAG_END_HEADERS, 3, &second));
        let mut rewriter = ClientStreamRewriter::new();
        let mut out = BytesMut::new();
        let err = rewriter.process(&mut BytesMut::from(&input[..]), &mut out).unwrap_err();
        assert!(matches!(err, AuthorityRewriteError::Hpack { stream_id: 3, .. }), "{err}");
    }

    #[test]
    fn frame_between_headers_and_continuation_is_rejected() {
        let mut encoder = Encoder::default();
        let block = encode(&mut encoder, &request_headers(b"%2Fs"));
        let mut input = PREFACE.to_vec();
        input.extend(frame(FRAME_HEADERS, 0, 1, &block[..5]));
        input.extend(frame(0x0, 0, 1, b"x"));
        let err = ClientStreamRewriter::new()
            .process(&mut BytesMut::from(&input[..]), &mut BytesMut::new())
            .unwrap_err();
        assert!(matches!(
            err,
            AuthorityRewriteError::InterruptedHeaderBlock { expected_stream: 1, frame_type: 0, .. }
        ));
    }

    #[test]
    fn a_block_ending_inside_a_literal_is_refused_without_a_panic() {
        // Literal without indexing, name index 1 (`:authority`), and no value string: the
        // block the property test found (the decoder crate panicked on it).
        for block in [&[0x01][..], &[0x41], &[0x00], &[0x00, 0x01, b'a']] {
            let mut input = PREFACE.to_vec();
            input.extend(frame(FRAME_HEADERS, FLAG_END_HEADERS, 1, block));
            let err = ClientStreamRewriter::new()
                .process(&mut BytesMut::from(&input[..]), &mut BytesMut::new())
                .unwrap_err();
            assert!(
                matches!(err, AuthorityRewriteError::Hpack { stream_id: 1, .. }),
                "{block:?}: {err}"
            );
        }
    }

    #[test]
    fn a_size_update_after_a_field_is_refused() {
        // `:method: GET` (static index 2), then a size update to 0: RFC 7541 §4.2 allows one
        // only at the start of a block, and h2 ends the connection on this one. Found by the
        // fuzz property (the decoder crate applies it anywhere).
        let mut input = PREFACE.to_vec();
        input.extend(frame(FRAME_HEADERS, FLAG_END_HEADERS, 1, &[0x82, 0x20]));
        let err = ClientStreamRewriter::new()
            .process(&mut BytesMut::from(&input[..]), &mut BytesMut::new())
            .unwrap_err();
        assert!(
            matches!(
                err,
                AuthorityRewriteError::Hpack {
                    stream_id: 1,
                    source: DecoderError::InvalidMaxDynamicSize
                }
            ),
            "{err}"
        );
        // At the start of a block it is applied as before.
        let mut input = PREFACE.to_vec();
        input.extend(frame(FRAME_HEADERS, FLAG_END_HEADERS, 1, &[0x20, 0x82]));
        let (_, out) = run(&input);
        assert_eq!(
            server_view(&out).header_lists,
            vec![vec![(b":method".to_vec(), b"GET".to_vec())]]
        );
    }

    #[test]
    fn huffman_strings_with_wrong_padding_are_refused() {
        // `:authority` (static name 1) with the Huffman value "a": code 00011, then the
        // padding. Only `111` (the start of EOS) is valid; h2 ends the connection on the rest.
        let block = |value: &[u8]| {
            let mut input = PREFACE.to_vec();
            let mut payload = vec![0x01, 0x80 | u8::try_from(value.len()).unwrap()];
            payload.extend(value);
            input.extend(frame(FRAME_HEADERS, FLAG_END_HEADERS, 1, &payload));
            input
        };
        let (_, out) = run(&block(&[0x1f]));
        assert_eq!(
            server_view(&out).header_lists[0],
            vec![(b":authority".to_vec(), b"a".to_vec())]
        );
        for wrong in [&[0x18][..], &[0x1e], &[0x1f, 0xff]] {
            let err = ClientStreamRewriter::new()
                .process(&mut BytesMut::from(&block(wrong)[..]), &mut BytesMut::new())
                .unwrap_err();
            assert!(matches!(err, AuthorityRewriteError::Hpack { stream_id: 1, .. }), "{wrong:?}");
        }
    }

    #[test]
    fn oversized_padding_is_rejected() {
        let mut input = PREFACE.to_vec();
        input.extend(frame(FRAME_HEADERS, FLAG_PADDED | FLAG_END_HEADERS, 1, &[9, 0x82]));
        let err = ClientStreamRewriter::new()
            .process(&mut BytesMut::from(&input[..]), &mut BytesMut::new())
            .unwrap_err();
        assert!(err.to_string().contains("padding"), "{err}");
    }

    /// Deterministic pseudo-random numbers (no extra dependency for one test).
    struct Lcg(u64);

    impl Lcg {
        fn below(&mut self, n: usize) -> usize {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            usize::try_from(self.0 >> 33).unwrap() % n
        }
    }

    #[test]
    fn many_connections_with_random_encodings_and_splits_keep_every_header() {
        let mut rng = Lcg(42);
        let authorities: [&[u8]; 3] = [b"%2Fvar%2Flib%2Fx.sock", b"/var/lib/x.sock", b"localhost"];
        let paths: [&[u8]; 3] =
            [b"/a.B/C", b"/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources", b"/x"];
        for _connection in 0..200 {
            let mut encoder = Encoder::default();
            let mut input = PREFACE.to_vec();
            let mut expected = Vec::new();
            for request in 0..=rng.below(6) {
                if rng.below(4) == 0 {
                    // Shrink then regrow the table, as an encoder may at the start of a block.
                    let size = u32::try_from(rng.below(4097)).unwrap();
                    let mut update = Vec::new();
                    encoder.update_max_dynamic_size(size, &mut update).unwrap();
                    let mut headers = request_headers(authorities[rng.below(3)]);
                    headers[2].1 = paths[rng.below(3)].to_vec();
                    let mut block = update;
                    block.extend(encode_with(&mut encoder, &headers, &mut rng));
                    push_block(
                        &mut input,
                        &block,
                        2 * u32::try_from(request).unwrap() + 1,
                        &mut rng,
                    );
                    expected.push(rewritten(headers));
                } else {
                    let mut headers = request_headers(authorities[rng.below(3)]);
                    headers[2].1 = paths[rng.below(3)].to_vec();
                    headers.push((b"x-n".to_vec(), vec![b'n'; rng.below(300)]));
                    let block = encode_with(&mut encoder, &headers, &mut rng);
                    push_block(
                        &mut input,
                        &block,
                        2 * u32::try_from(request).unwrap() + 1,
                        &mut rng,
                    );
                    expected.push(rewritten(headers));
                }
                input.extend(frame(
                    0x0,
                    FLAG_END_STREAM,
                    2 * u32::try_from(request).unwrap() + 1,
                    b"\0\0\0\0\0",
                ));
            }
            // Feed in random chunks.
            let mut rewriter = ClientStreamRewriter::new();
            let (mut inbuf, mut out) = (BytesMut::new(), BytesMut::new());
            let mut rest = &input[..];
            while !rest.is_empty() {
                let (chunk, tail) = rest.split_at(1 + rng.below(rest.len().min(64)));
                inbuf.extend_from_slice(chunk);
                rewriter.process(&mut inbuf, &mut out).unwrap();
                rest = tail;
            }
            assert!(inbuf.is_empty());
            assert_eq!(server_view(&out).header_lists, expected);
        }
    }

    fn encode_with(encoder: &mut Encoder<'_>, headers: &HeaderList, rng: &mut Lcg) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, value) in headers {
            let choices = [
                Encoder::HUFFMAN_NAME
                    | Encoder::HUFFMAN_VALUE
                    | Encoder::WITH_INDEXING
                    | Encoder::BEST_FORMAT,
                Encoder::HUFFMAN_VALUE | Encoder::BEST_FORMAT,
                Encoder::NEVER_INDEXED,
                Encoder::WITH_INDEXING,
            ];
            let flags = choices[rng.below(choices.len())];
            encoder.encode((name.clone(), value.clone(), flags), &mut out).unwrap();
        }
        out
    }

    /// HEADERS plus CONTINUATIONs at random split points, sometimes padded.
    fn push_block(input: &mut Vec<u8>, block: &[u8], stream_id: u32, rng: &mut Lcg) {
        let first_len = block.len().min(1 + rng.below(block.len().max(1)));
        let (first, mut rest) = block.split_at(first_len);
        let end = if rest.is_empty() { FLAG_END_HEADERS } else { 0 };
        if rng.below(2) == 0 {
            let pad = u8::try_from(rng.below(20)).unwrap();
            let mut payload = vec![pad];
            payload.extend(first);
            payload.extend(vec![0; usize::from(pad)]);
            input.extend(frame(FRAME_HEADERS, FLAG_PADDED | end, stream_id, &payload));
        } else {
            input.extend(frame(FRAME_HEADERS, end, stream_id, first));
        }
        while !rest.is_empty() {
            let (chunk, tail) = rest.split_at(rest.len().min(1 + rng.below(40)));
            let end = if tail.is_empty() { FLAG_END_HEADERS } else { 0 };
            input.extend(frame(FRAME_CONTINUATION, end, stream_id, chunk));
            rest = tail;
        }
    }

    fn rewritten(mut headers: HeaderList) -> HeaderList {
        if !is_acceptable_authority(&headers[3].1) {
            headers[3].1 = REPLACEMENT_AUTHORITY.to_vec();
        }
        headers
    }

    #[test]
    fn non_http2_bytes_pass_through_unchanged() {
        let input = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        let (_, out) = run(input);
        assert_eq!(out, input);
    }
}

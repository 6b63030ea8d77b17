//! Netlink attributes (`struct nlattr`: a 4-byte header of length and type, the value, padding
//! to 4 bytes), the unit `TCA_OPTIONS` nests.

/// One attribute: its type and its value bytes (without header or padding).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nla {
    /// `nla_type` (the nested-flag and byte-order bits cleared on decode).
    pub kind: u16,
    /// The value.
    pub value: Vec<u8>,
}

/// Why an attribute stream could not be split.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NlaError {
    /// A header claims a length below its own size or beyond the buffer.
    #[error("attribute at byte {at}: length {len} does not fit the {left} bytes left")]
    BadLength {
        /// Offset of the header.
        at: usize,
        /// The length it claims.
        len: usize,
        /// Bytes left from the header on.
        left: usize,
    },
}

/// `NLA_HDRLEN`.
const HEADER: usize = 4;
/// `NLA_F_NESTED | NLA_F_NET_BYTEORDER`: flags in `nla_type`, not part of the type.
const TYPE_FLAGS: u16 = 0xc000;

fn aligned(len: usize) -> usize {
    len.div_ceil(4) * 4
}

impl Nla {
    /// An attribute of `kind` with `value`.
    #[must_use]
    pub fn new(kind: u16, value: Vec<u8>) -> Self {
        Self { kind, value }
    }

    /// A `u32` attribute.
    #[must_use]
    pub fn u32(kind: u16, value: u32) -> Self {
        Self::new(kind, value.to_ne_bytes().to_vec())
    }

    /// A `u64` attribute.
    #[must_use]
    pub fn u64(kind: u16, value: u64) -> Self {
        Self::new(kind, value.to_ne_bytes().to_vec())
    }

    /// A `u8` attribute.
    #[must_use]
    pub fn u8(kind: u16, value: u8) -> Self {
        Self::new(kind, vec![value])
    }
}

/// `attrs` as one attribute stream (each padded to 4 bytes), the value of a nest.
///
/// # Panics
/// Never for values the codecs of this crate make; a value longer than 65531 bytes cannot be
/// an attribute and panics.
#[must_use]
pub fn encode(attrs: &[Nla]) -> Vec<u8> {
    let mut out = Vec::with_capacity(attrs.iter().map(|a| HEADER + aligned(a.value.len())).sum());
    for attr in attrs {
        let len = u16::try_from(HEADER + attr.value.len())
            .expect("qdisc option values are a few dozen bytes, far below nla_len's 64 KiB");
        out.extend_from_slice(&len.to_ne_bytes());
        out.extend_from_slice(&attr.kind.to_ne_bytes());
        out.extend_from_slice(&attr.value);
        out.resize(aligned(out.len()), 0);
    }
    out
}

/// Splits an attribute stream (the value of a nest) into its attributes.
pub fn decode(bytes: &[u8]) -> Result<Vec<Nla>, NlaError> {
    let mut attrs = Vec::new();
    let mut at = 0;
    while bytes.len() - at >= HEADER {
        let len = usize::from(u16::from_ne_bytes([bytes[at], bytes[at + 1]]));
        let kind = u16::from_ne_bytes([bytes[at + 2], bytes[at + 3]]) & !TYPE_FLAGS;
        let left = bytes.len() - at;
        if len < HEADER || len > left {
            return Err(NlaError::BadLength { at, len, left });
        }
        attrs.push(Nla { kind, value: bytes[at + HEADER..at + len].to_vec() });
        at += aligned(len).min(left);
    }
    Ok(attrs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_round_trips_with_padding() {
        let attrs = vec![Nla::u8(15, 1), Nla::u32(1, 10_000), Nla::u64(4, 1 << 40)];
        let bytes = encode(&attrs);
        // 4+1 padded to 8, 4+4, 4+8.
        assert_eq!(bytes.len(), 8 + 8 + 12);
        assert_eq!(&bytes[0..2], &5u16.to_ne_bytes(), "nla_len counts the value, not the padding");
        assert_eq!(decode(&bytes).unwrap(), attrs);
    }

    #[test]
    fn the_nested_flag_is_not_part_of_the_type() {
        let mut bytes = encode(&[Nla::u32(2, 7)]);
        bytes[3] |= 0x80;
        assert_eq!(decode(&bytes).unwrap(), vec![Nla::u32(2, 7)]);
    }

    #[test]
    fn a_length_beyond_the_buffer_is_refused() {
        let mut bytes = encode(&[Nla::u32(2, 7)]);
        bytes[0] = 200;
        assert_eq!(decode(&bytes), Err(NlaError::BadLength { at: 0, len: 200, left: 8 }));
        bytes[0] = 2;
        assert!(decode(&bytes).is_err(), "shorter than its header");
    }
}

//! The ethtool family's wire format (`include/uapi/linux/ethtool_netlink.h`): message ids,
//! attribute ids, and the few attribute shapes its requests use (u32, string, flag, nest),
//! with the parsing of the replies this crate reads.

use netlink_packet_core::{
    DecodeError, Emitable, Nla, NlaBuffer, NlasIterator, ParseableParametrized, emit_u32,
    parse_string, parse_u32,
};
use netlink_packet_generic::{GenlFamily, GenlHeader};

/// `ETHTOOL_GENL_NAME`.
pub(crate) const FAMILY: &str = "ethtool";
/// `ETHTOOL_GENL_VERSION`.
pub(crate) const VERSION: u8 = 1;

// Message ids, user to kernel (`ETHTOOL_MSG_*`).
pub(crate) const MSG_STRSET_GET: u8 = 1;
pub(crate) const MSG_FEATURES_GET: u8 = 11;
pub(crate) const MSG_FEATURES_SET: u8 = 12;
pub(crate) const MSG_RINGS_GET: u8 = 15;
pub(crate) const MSG_RINGS_SET: u8 = 16;
pub(crate) const MSG_CHANNELS_GET: u8 = 17;
pub(crate) const MSG_CHANNELS_SET: u8 = 18;

// The common request header (`ETHTOOL_A_HEADER_*`), nested as attribute 1 of every message.
pub(crate) const A_HEADER: u16 = 1;
const A_HEADER_DEV_NAME: u16 = 2;
const A_HEADER_FLAGS: u16 = 3;
/// `ETHTOOL_FLAG_COMPACT_BITSETS`: bitsets as bitmaps in replies.
pub(crate) const FLAG_COMPACT_BITSETS: u32 = 1;
/// `ETHTOOL_FLAG_OMIT_REPLY`: no `*_SET_REPLY`, only the ACK.
pub(crate) const FLAG_OMIT_REPLY: u32 = 1 << 1;

// `ETHTOOL_A_STRSET_*` and the nests below it.
pub(crate) const A_STRSET_STRINGSETS: u16 = 2;
pub(crate) const A_STRINGSETS_STRINGSET: u16 = 1;
pub(crate) const A_STRINGSET_ID: u16 = 1;
pub(crate) const A_STRINGSET_STRINGS: u16 = 3;
pub(crate) const A_STRINGS_STRING: u16 = 1;
pub(crate) const A_STRING_INDEX: u16 = 1;
pub(crate) const A_STRING_VALUE: u16 = 2;
/// `ETH_SS_FEATURES`: the netdev feature names (`netdev_features_strings`).
pub(crate) const ETH_SS_FEATURES: u32 = 4;

// `ETHTOOL_A_FEATURES_*`.
pub(crate) const A_FEATURES_HW: u16 = 2;
pub(crate) const A_FEATURES_WANTED: u16 = 3;
pub(crate) const A_FEATURES_ACTIVE: u16 = 4;
pub(crate) const A_FEATURES_NOCHANGE: u16 = 5;

// `ETHTOOL_A_BITSET_*`, `ETHTOOL_A_BITSET_BITS_*`, `ETHTOOL_A_BITSET_BIT_*`.
pub(crate) const A_BITSET_SIZE: u16 = 2;
pub(crate) const A_BITSET_BITS: u16 = 3;
pub(crate) const A_BITSET_VALUE: u16 = 4;
pub(crate) const A_BITSET_BITS_BIT: u16 = 1;
pub(crate) const A_BITSET_BIT_NAME: u16 = 2;
pub(crate) const A_BITSET_BIT_VALUE: u16 = 3;

// `ETHTOOL_A_RINGS_*`: the maxima 2..=5, the sizes 6..=9 (same order: rx, rx-mini,
// rx-jumbo, tx).
pub(crate) const A_RINGS_RX_MAX: u16 = 2;
pub(crate) const A_RINGS_RX: u16 = 6;

// `ETHTOOL_A_CHANNELS_*`: the maxima 2..=5, the counts 6..=9 (same order: rx, tx, other,
// combined).
pub(crate) const A_CHANNELS_RX_MAX: u16 = 2;
pub(crate) const A_CHANNELS_RX_COUNT: u16 = 6;

/// `NLA_F_NESTED`: the kernel's policy checks it on nests of the ethtool family.
const NLA_F_NESTED: u16 = 1 << 15;
/// `NLA_F_NET_BYTEORDER`.
const NLA_F_NET_BYTEORDER: u16 = 1 << 14;

/// One request attribute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Attr {
    /// `NLA_U32`.
    U32(u16, u32),
    /// `NLA_NUL_STRING`.
    Str(u16, String),
    /// `NLA_FLAG` (no payload).
    Flag(u16),
    /// A nest of attributes.
    Nest(u16, Vec<Attr>),
}

impl Attr {
    /// The request header naming `dev`, with `flags` (`ETHTOOL_FLAG_*`) when not 0.
    pub(crate) fn header(dev: &str, flags: u32) -> Attr {
        let mut inner = vec![Attr::Str(A_HEADER_DEV_NAME, dev.to_owned())];
        if flags != 0 {
            inner.push(Attr::U32(A_HEADER_FLAGS, flags));
        }
        Attr::Nest(A_HEADER, inner)
    }
}

impl Nla for Attr {
    fn value_len(&self) -> usize {
        match self {
            Attr::U32(..) => 4,
            Attr::Str(_, s) => s.len() + 1,
            Attr::Flag(_) => 0,
            Attr::Nest(_, inner) => inner.as_slice().buffer_len(),
        }
    }

    fn kind(&self) -> u16 {
        match self {
            Attr::U32(kind, _) | Attr::Str(kind, _) | Attr::Flag(kind) => *kind,
            Attr::Nest(kind, _) => *kind | NLA_F_NESTED,
        }
    }

    fn emit_value(&self, buffer: &mut [u8]) {
        match self {
            Attr::U32(_, value) => emit_u32(buffer, *value).expect("value_len gave 4 bytes"),
            Attr::Str(_, s) => {
                buffer[..s.len()].copy_from_slice(s.as_bytes());
                buffer[s.len()] = 0;
            }
            Attr::Flag(_) => {}
            Attr::Nest(_, inner) => inner.as_slice().emit(buffer),
        }
    }
}

/// An ethtool message: the command and its attributes (requests), or the raw attributes of
/// a reply, parsed by the reader that asked for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Message {
    /// `ETHTOOL_MSG_*`.
    pub(crate) cmd: u8,
    /// Request attributes (empty in a reply).
    pub(crate) attrs: Vec<Attr>,
    /// Reply attributes as received (empty in a request).
    pub(crate) raw: Vec<u8>,
}

impl GenlFamily for Message {
    fn family_name() -> &'static str {
        FAMILY
    }

    fn command(&self) -> u8 {
        self.cmd
    }

    fn version(&self) -> u8 {
        VERSION
    }
}

impl Emitable for Message {
    fn buffer_len(&self) -> usize {
        self.attrs.as_slice().buffer_len()
    }

    fn emit(&self, buffer: &mut [u8]) {
        self.attrs.as_slice().emit(buffer);
    }
}

impl ParseableParametrized<[u8], GenlHeader> for Message {
    fn parse_with_param(buf: &[u8], header: GenlHeader) -> Result<Self, DecodeError> {
        Ok(Message { cmd: header.cmd, attrs: Vec::new(), raw: buf.to_vec() })
    }
}

/// The attributes in `buf` as (kind without flags, payload).
pub(crate) fn attrs(buf: &[u8]) -> Result<Vec<(u16, &[u8])>, DecodeError> {
    let mut out = Vec::new();
    for nla in NlasIterator::new(buf) {
        let nla: NlaBuffer<&[u8]> = nla?;
        let (kind, len) = (nla.kind() & !(NLA_F_NESTED | NLA_F_NET_BYTEORDER), nla.length());
        let value = nla
            .into_inner()
            .get(4..usize::from(len))
            .ok_or_else(|| DecodeError::from("an attribute longer than its message"))?;
        out.push((kind, value));
    }
    Ok(out)
}

/// The u32 payload of an attribute.
pub(crate) fn u32_of(payload: &[u8]) -> Result<u32, DecodeError> {
    parse_u32(payload)
}

/// The NUL-terminated string payload of an attribute.
pub(crate) fn string_of(payload: &[u8]) -> Result<String, DecodeError> {
    parse_string(payload)
}

/// A compact bitset (`ETHTOOL_A_BITSET_SIZE` and `_VALUE`, the kernel's answer to a request
/// with `ETHTOOL_FLAG_COMPACT_BITSETS`) as one bool per bit.
pub(crate) fn compact_bitset(payload: &[u8]) -> Result<Vec<bool>, DecodeError> {
    let mut size = None;
    let mut words: Vec<u32> = Vec::new();
    for (kind, value) in attrs(payload)? {
        match kind {
            A_BITSET_SIZE => size = Some(u32_of(value)?),
            A_BITSET_VALUE => {
                // `u32` words in host byte order (`ethnl_put_bitset32`).
                words = value
                    .chunks_exact(4)
                    .map(|w| u32::from_ne_bytes([w[0], w[1], w[2], w[3]]))
                    .collect();
            }
            A_BITSET_BITS => {
                return Err(DecodeError::from(
                    "a verbose bitset where a compact one was asked for",
                ));
            }
            _ => {}
        }
    }
    let size = size.ok_or_else(|| DecodeError::from("a bitset without ETHTOOL_A_BITSET_SIZE"))?;
    let size = usize::try_from(size).map_err(|_| DecodeError::from("a bitset too large"))?;
    Ok((0..size)
        .map(|bit| words.get(bit / 32).is_some_and(|w| w & (1 << (bit % 32)) != 0))
        .collect())
}

/// A verbose bitset that changes only the bits it names (no `ETHTOOL_A_BITSET_NOMASK`):
/// each (name, value) becomes one `ETHTOOL_A_BITSET_BITS_BIT`, `_VALUE` present when true.
pub(crate) fn named_bits(kind: u16, bits: &[(String, bool)]) -> Attr {
    let bits = bits
        .iter()
        .map(|(name, on)| {
            let mut bit = vec![Attr::Str(A_BITSET_BIT_NAME, name.clone())];
            if *on {
                bit.push(Attr::Flag(A_BITSET_BIT_VALUE));
            }
            Attr::Nest(A_BITSET_BITS_BIT, bit)
        })
        .collect();
    Attr::Nest(kind, vec![Attr::Nest(A_BITSET_BITS, bits)])
}

/// The strings of string set `id` in a `STRSET_GET` reply, by index.
pub(crate) fn string_set(raw: &[u8], id: u32) -> Result<Vec<String>, DecodeError> {
    for (kind, sets) in attrs(raw)? {
        if kind != A_STRSET_STRINGSETS {
            continue;
        }
        for (kind, set) in attrs(sets)? {
            if kind != A_STRINGSETS_STRINGSET {
                continue;
            }
            let fields = attrs(set)?;
            let this = fields.iter().find(|(k, _)| *k == A_STRINGSET_ID).map(|(_, v)| u32_of(v));
            if this.transpose()? != Some(id) {
                continue;
            }
            let mut names: Vec<String> = Vec::new();
            for (kind, strings) in fields {
                if kind != A_STRINGSET_STRINGS {
                    continue;
                }
                for (kind, string) in attrs(strings)? {
                    if kind != A_STRINGS_STRING {
                        continue;
                    }
                    let (mut index, mut value) = (None, None);
                    for (kind, v) in attrs(string)? {
                        match kind {
                            A_STRING_INDEX => index = Some(u32_of(v)?),
                            A_STRING_VALUE => value = Some(string_of(v)?),
                            _ => {}
                        }
                    }
                    let (Some(index), Some(value)) = (index, value) else { continue };
                    let index = usize::try_from(index)
                        .map_err(|_| DecodeError::from("a string index too large"))?;
                    if names.len() <= index {
                        names.resize(index + 1, String::new());
                    }
                    names[index] = value;
                }
            }
            return Ok(names);
        }
    }
    Err(DecodeError::from(format!("string set {id} missing from the reply")))
}

/// Four consecutive u32 attributes starting at `first` (`None` where the kernel left one
/// out: the driver does not have that ring or channel kind).
pub(crate) fn four_u32(raw: &[u8], first: u16) -> Result<[Option<u32>; 4], DecodeError> {
    let mut out = [None; 4];
    for (kind, value) in attrs(raw)? {
        if (first..first + 4).contains(&kind) {
            out[usize::from(kind - first)] = Some(u32_of(value)?);
        }
    }
    Ok(out)
}

/// The u32 attributes `first..first + 4` for the values that are set.
pub(crate) fn four_u32_attrs(first: u16, values: [Option<u32>; 4]) -> Vec<Attr> {
    (first..).zip(values).filter_map(|(kind, value)| value.map(|v| Attr::U32(kind, v))).collect()
}

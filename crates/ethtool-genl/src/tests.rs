//! The codec against replies laid out as `ethnl_put_bitset32`, `strset_fill_reply`,
//! `rings_fill_reply` and `channels_fill_reply` lay them out (the kernel answers themselves
//! are checked by the driver's netns tests on a veth and its VM tests on igb).

use netlink_packet_core::Emitable;

use super::wire::{self, Attr};
use super::{NLM_F_ACK_TLVS, NLM_F_CAPPED, extack_message};

fn emit(attrs: &[Attr]) -> Vec<u8> {
    let mut out = vec![0; attrs.buffer_len()];
    attrs.emit(&mut out);
    out
}

#[test]
fn a_compact_bitset_reads_bit_by_bit_across_words() {
    // Bits 0, 3 and 33 of 40; the value is two u32 words. Written as raw bytes, since a
    // binary attribute is neither a string nor a u32.
    let mut value = Vec::new();
    value.extend_from_slice(&((1u32 << 0) | (1 << 3)).to_ne_bytes());
    value.extend_from_slice(&(1u32 << 1).to_ne_bytes());
    let mut raw = emit(&[Attr::U32(wire::A_BITSET_SIZE, 40)]);
    raw.extend_from_slice(&u16::try_from(4 + value.len()).unwrap().to_ne_bytes());
    raw.extend_from_slice(&wire::A_BITSET_VALUE.to_ne_bytes());
    raw.extend_from_slice(&value);
    let bits = wire::compact_bitset(&raw).unwrap();
    assert_eq!(bits.len(), 40);
    let set: Vec<usize> = bits.iter().enumerate().filter(|(_, b)| **b).map(|(i, _)| i).collect();
    assert_eq!(set, [0, 3, 33]);
}

#[test]
fn a_bitset_without_size_or_in_verbose_form_is_an_error() {
    assert!(wire::compact_bitset(&[]).is_err());
    let verbose =
        emit(&[Attr::U32(wire::A_BITSET_SIZE, 8), Attr::Nest(wire::A_BITSET_BITS, vec![])]);
    assert!(wire::compact_bitset(&verbose).is_err());
}

#[test]
fn the_feature_string_set_is_read_by_index_and_other_sets_are_skipped() {
    let string = |i: u32, s: &str| {
        Attr::Nest(
            wire::A_STRINGS_STRING,
            vec![Attr::U32(wire::A_STRING_INDEX, i), Attr::Str(wire::A_STRING_VALUE, s.to_owned())],
        )
    };
    let set = |id: u32, strings: Vec<Attr>| {
        Attr::Nest(
            wire::A_STRINGSETS_STRINGSET,
            vec![
                Attr::U32(wire::A_STRINGSET_ID, id),
                Attr::Nest(wire::A_STRINGSET_STRINGS, strings),
            ],
        )
    };
    let raw = emit(&[
        Attr::header("eth0", 0),
        Attr::Nest(
            wire::A_STRSET_STRINGSETS,
            vec![
                set(1, vec![string(0, "rx_packets")]),
                set(
                    wire::ETH_SS_FEATURES,
                    vec![string(1, "tx-checksum-ipv4"), string(0, "tx-scatter-gather")],
                ),
            ],
        ),
    ]);
    let names = wire::string_set(&raw, wire::ETH_SS_FEATURES).unwrap();
    assert_eq!(names, ["tx-scatter-gather", "tx-checksum-ipv4"]);
    assert!(wire::string_set(&raw, 7).is_err());
}

#[test]
fn a_features_set_names_each_bit_and_marks_only_the_ones_turned_on() {
    let attr = wire::named_bits(
        wire::A_FEATURES_WANTED,
        &[("rx-checksum".to_owned(), true), ("tx-tcp-segmentation".to_owned(), false)],
    );
    let raw = emit(&[attr]);
    let [(kind, bitset)] = wire::attrs(&raw).unwrap()[..] else { panic!("one attribute") };
    assert_eq!(kind, wire::A_FEATURES_WANTED);
    let [(kind, bits)] = wire::attrs(bitset).unwrap()[..] else { panic!("only BITS, no NOMASK") };
    assert_eq!(kind, wire::A_BITSET_BITS);
    let bits = wire::attrs(bits).unwrap();
    assert_eq!(bits.len(), 2);
    let read = |payload: &[u8]| {
        let fields = wire::attrs(payload).unwrap();
        let name = fields
            .iter()
            .find(|(k, _)| *k == wire::A_BITSET_BIT_NAME)
            .map(|(_, v)| wire::string_of(v).unwrap());
        let on = fields.iter().any(|(k, _)| *k == wire::A_BITSET_BIT_VALUE);
        (name.unwrap(), on)
    };
    assert_eq!(read(bits[0].1), ("rx-checksum".to_owned(), true));
    assert_eq!(read(bits[1].1), ("tx-tcp-segmentation".to_owned(), false));
    // Nests carry NLA_F_NESTED (the family's policy rejects a nest without it).
    assert_eq!(u16::from_ne_bytes([raw[2], raw[3]]), wire::A_FEATURES_WANTED | (1 << 15));
}

#[test]
fn rings_and_channels_keep_absent_kinds_absent() {
    let raw = emit(&[
        Attr::header("eth0", 0),
        Attr::U32(wire::A_RINGS_RX_MAX, 4096),
        Attr::U32(wire::A_RINGS_RX_MAX + 3, 4096),
        Attr::U32(wire::A_RINGS_RX, 256),
        Attr::U32(wire::A_RINGS_RX + 3, 512),
    ]);
    assert_eq!(wire::four_u32(&raw, wire::A_RINGS_RX).unwrap(), [Some(256), None, None, Some(512)]);
    assert_eq!(
        wire::four_u32(&raw, wire::A_RINGS_RX_MAX).unwrap(),
        [Some(4096), None, None, Some(4096)]
    );
    let attrs = wire::four_u32_attrs(wire::A_CHANNELS_RX_COUNT, [None, None, None, Some(1)]);
    assert_eq!(attrs, [Attr::U32(wire::A_CHANNELS_RX_COUNT + 3, 1)]);
}

#[test]
fn the_extended_ack_message_is_found_after_a_capped_or_full_echo() {
    let tlvs = emit(&[Attr::Str(1, "requested ring size exceeds maximum".to_owned())]);
    let mut capped = vec![0u8; 16];
    capped.extend_from_slice(&tlvs);
    assert_eq!(
        extack_message(NLM_F_CAPPED | NLM_F_ACK_TLVS, &capped).as_deref(),
        Some("requested ring size exceeds maximum")
    );
    // Uncapped: the whole request (24 bytes here) is echoed first.
    let mut full = 24u32.to_ne_bytes().to_vec();
    full.resize(24, 0);
    full.extend_from_slice(&tlvs);
    assert_eq!(
        extack_message(NLM_F_ACK_TLVS, &full).as_deref(),
        Some("requested ring size exceeds maximum")
    );
    assert_eq!(extack_message(NLM_F_CAPPED, &capped), None);
}

/// Against the running kernel, read-only, on `lo` (every network namespace has one): the
/// feature names come from the kernel, `lo`'s checksum offload is fixed on, and `lo` has no
/// rings (`EOPNOTSUPP`, with the errno kept).
#[test]
fn the_running_kernel_answers_for_lo() {
    let mut client = match super::Client::open() {
        Err(super::Error::NoFamily) => return,
        other => other.unwrap(),
    };
    let features = client.features("lo").unwrap();
    assert!(
        features.names().any(|n| n == "tx-scatter-gather"),
        "{:?}",
        features.names().collect::<Vec<_>>()
    );
    let loopback = features.get("loopback").unwrap();
    assert!(loopback.active && !loopback.changeable, "{loopback:?}");
    assert!(features.get("no-such-feature").is_none());
    let err = client.rings("lo").unwrap_err();
    assert_eq!(err.errno(), Some(95), "{err}");
    let err = client.features("no-such-dev0").unwrap_err();
    assert_eq!(err.errno(), Some(19), "{err}");
}

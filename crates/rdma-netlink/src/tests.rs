//! The codec against byte buffers laid out as the kernel's `nldev.c` writes them (attribute
//! numbers from `include/uapi/rdma/rdma_netlink.h`, 64-bit values preceded by a
//! `RDMA_NLDEV_ATTR_PAD` attribute when `nla_put_u64_64bit` needs one) and as `rdma` sends
//! its requests.

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};

use super::*;
use crate::client::{absorb, split};

/// One netlink attribute: header (length, type), value, padding to 4 bytes.
fn nla(kind: u16, value: &[u8]) -> Vec<u8> {
    let length = u16::try_from(4 + value.len()).unwrap();
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&length.to_ne_bytes());
    bytes.extend_from_slice(&kind.to_ne_bytes());
    bytes.extend_from_slice(value);
    while bytes.len() % 4 != 0 {
        bytes.push(0);
    }
    bytes
}

fn nla_str(kind: u16, text: &str) -> Vec<u8> {
    let mut value = text.as_bytes().to_vec();
    value.push(0);
    nla(kind, &value)
}

/// A netlink message: header (length, type, flags, sequence, port) and payload.
fn nlmsg(message_type: u16, flags: u16, sequence: u32, payload: &[u8]) -> Vec<u8> {
    let length = u32::try_from(16 + payload.len()).unwrap();
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&length.to_ne_bytes());
    bytes.extend_from_slice(&message_type.to_ne_bytes());
    bytes.extend_from_slice(&flags.to_ne_bytes());
    bytes.extend_from_slice(&sequence.to_ne_bytes());
    bytes.extend_from_slice(&0u32.to_ne_bytes());
    bytes.extend_from_slice(payload);
    bytes
}

/// What the kernel answers to a device dump for `rxe0` (index 3, one port): `fill_dev_info`
/// order, with the capability flags and GUIDs behind pad attributes.
fn rxe_device_answer(sequence: u32) -> Vec<u8> {
    let payload = [
        nla(attr::DEV_INDEX, &3u32.to_ne_bytes()),
        nla_str(attr::DEV_NAME, "rxe0"),
        nla(attr::PORT_INDEX, &1u32.to_ne_bytes()),
        nla(attr::PAD, &[]),
        nla(4, &0x0000_0000_0123_4567u64.to_ne_bytes()),
        nla(attr::NODE_GUID, &0x5054_00ff_fe12_3456u64.to_ne_bytes()),
        nla(attr::SYS_IMAGE_GUID, &0x5054_00ff_fe12_3456u64.to_ne_bytes()),
        nla(attr::DEV_NODE_TYPE, &[1]),
        nla(83, &[0]),
        nla_str(attr::DEV_PROTOCOL, "roce"),
    ]
    .concat();
    nlmsg(message_type(command::GET), 2, sequence, &payload)
}

#[test]
fn message_types_follow_rdma_nl_get_type() {
    // RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, op) = (5 << 10) + op.
    assert_eq!(message_type(command::GET), 0x1401);
    assert_eq!(message_type(command::PORT_GET), 0x1405);
    assert_eq!(message_type(command::SYS_GET), 0x1406);
    assert_eq!(client_of(0x1405), RDMA_NL_NLDEV);
    assert_eq!(op_of(0x1405), command::PORT_GET);
}

#[test]
fn a_device_answer_decodes() {
    let datagram = rxe_device_answer(7);
    let messages = split(&datagram).unwrap();
    assert_eq!(messages.len(), 1);
    let NetlinkPayload::InnerMessage(message) = &messages[0].payload else {
        panic!("not an inner message: {:?}", messages[0].payload);
    };
    assert_eq!(message.command, command::GET);
    let device = Device::try_from(message).unwrap();
    assert_eq!(
        device,
        Device {
            index: 3,
            name: "rxe0".to_owned(),
            ports: 1,
            firmware: None,
            node_guid: Some(0x5054_00ff_fe12_3456),
            sys_image_guid: Some(0x5054_00ff_fe12_3456),
            node_type: Some(1),
            protocol: Some("roce".to_owned()),
        }
    );
    assert_eq!(node_type_name(1), "ca");
    // Attributes this crate does not name are kept raw, padding included.
    assert!(message.attributes.iter().any(|a| matches!(a, NldevAttribute::Other(_))));
}

#[test]
fn a_dump_of_two_devices_in_one_datagram_ends_with_done() {
    let mut datagram = rxe_device_answer(9);
    let second = [
        nla(attr::DEV_INDEX, &4u32.to_ne_bytes()),
        nla_str(attr::DEV_NAME, "mlx5_0"),
        nla(attr::PORT_INDEX, &2u32.to_ne_bytes()),
        nla_str(attr::FW_VERSION, "16.35.2000"),
    ]
    .concat();
    datagram.extend(nlmsg(message_type(command::GET), 2, 9, &second));
    datagram.extend(nlmsg(3, 2, 9, &0i32.to_ne_bytes()));

    let mut answers = Vec::new();
    let mut complete = false;
    for message in split(&datagram).unwrap() {
        complete = absorb(message, 9, NLM_F_DUMP, &mut answers).unwrap();
    }
    assert!(complete, "NLMSG_DONE ends the dump");
    let devices: Vec<Device> = answers.iter().map(|m| Device::try_from(m).unwrap()).collect();
    assert_eq!(devices.len(), 2);
    assert_eq!(devices[1].name, "mlx5_0");
    assert_eq!(devices[1].ports, 2);
    assert_eq!(devices[1].firmware.as_deref(), Some("16.35.2000"));
    assert_eq!(devices[1].node_guid, None);
}

#[test]
fn answers_of_other_requests_are_skipped() {
    let mut answers = Vec::new();
    let stale = split(&rxe_device_answer(1)).unwrap().remove(0);
    assert!(!absorb(stale, 2, NLM_F_DUMP, &mut answers).unwrap());
    assert!(answers.is_empty());
}

#[test]
fn a_port_answer_decodes_with_its_netdev() {
    let payload = [
        nla(attr::DEV_INDEX, &3u32.to_ne_bytes()),
        nla_str(attr::DEV_NAME, "rxe0"),
        nla(attr::PORT_INDEX, &1u32.to_ne_bytes()),
        nla(attr::PORT_STATE, &[4]),
        nla(attr::PORT_PHYS_STATE, &[5]),
        nla(attr::NDEV_INDEX, &12u32.to_ne_bytes()),
        nla_str(attr::NDEV_NAME, "veth-rxe"),
    ]
    .concat();
    let datagram = nlmsg(message_type(command::PORT_GET), 2, 4, &payload);
    let message = split(&datagram).unwrap().remove(0);
    let NetlinkPayload::InnerMessage(message) = message.payload else { panic!("not inner") };
    let port = Port::try_from(&message).unwrap();
    assert_eq!(port.port, 1);
    assert_eq!(port.state.map(port_state_name), Some("ACTIVE"));
    assert_eq!(port.phys_state.map(phys_state_name), Some("LINK_UP"));
    assert_eq!(port.netdev_index, Some(12));
    assert_eq!(port.netdev_name.as_deref(), Some("veth-rxe"));
}

#[test]
fn a_port_of_a_netdev_in_another_netns_has_no_netdev() {
    // fill_port_info leaves NDEV_* out when the netdev is not in the asking socket's netns.
    let payload = [
        nla(attr::DEV_INDEX, &3u32.to_ne_bytes()),
        nla_str(attr::DEV_NAME, "rxe0"),
        nla(attr::PORT_INDEX, &1u32.to_ne_bytes()),
    ]
    .concat();
    let datagram = nlmsg(message_type(command::PORT_GET), 2, 4, &payload);
    let NetlinkPayload::InnerMessage(message) = split(&datagram).unwrap().remove(0).payload else {
        panic!("not inner")
    };
    let port = Port::try_from(&message).unwrap();
    assert_eq!((port.netdev_index, port.netdev_name), (None, None));
}

#[test]
fn an_answer_without_the_device_index_is_an_error() {
    let payload = nla_str(attr::DEV_NAME, "rxe0");
    let datagram = nlmsg(message_type(command::GET), 2, 4, &payload);
    let NetlinkPayload::InnerMessage(message) = split(&datagram).unwrap().remove(0).payload else {
        panic!("not inner")
    };
    let err = Device::try_from(&message).unwrap_err();
    assert!(
        matches!(err, Error::MissingAttribute { attribute: "RDMA_NLDEV_ATTR_DEV_INDEX", .. }),
        "{err}"
    );
}

#[test]
fn the_netns_mode_answer_decodes() {
    // nldev_sys_get_doit: NETNS_MODE, then (newer kernels) COPY_ON_FORK and others.
    let payload = [nla(attr::NETNS_MODE, &[0]), nla(93, &[1])].concat();
    let datagram = nlmsg(message_type(command::SYS_GET), 0, 5, &payload);
    let mut answers = Vec::new();
    let message = split(&datagram).unwrap().remove(0);
    assert!(absorb(message, 5, 0, &mut answers).unwrap(), "a plain get has one answer");
    assert_eq!(answers[0].netns_mode().unwrap(), 0);
}

#[test]
fn a_wrongly_sized_integer_is_a_decode_error() {
    let payload = nla(attr::DEV_INDEX, &[1, 2]);
    let datagram = nlmsg(message_type(command::GET), 2, 4, &payload);
    assert!(split(&datagram).is_err());
}

#[test]
fn a_message_of_another_rdma_client_is_refused() {
    // RDMA_NL_LS (4): not ours to decode.
    let datagram = nlmsg((4 << 10) + 1, 0, 1, &[]);
    assert!(split(&datagram).is_err());
}

#[test]
fn a_kernel_error_carries_the_errno() {
    // NLMSG_ERROR: the errno (negative) then the request's header.
    let mut payload = (-95i32).to_ne_bytes().to_vec();
    payload.extend(nlmsg(message_type(command::SET), 5, 6, &[]));
    let datagram = nlmsg(2, 0, 6, &payload);
    let message = split(&datagram).unwrap().remove(0);
    let err = absorb(message, 6, NLM_F_ACK, &mut Vec::new()).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(95));
    let wrapped = Error::Kernel { command: command::name(command::SET), source: err };
    assert_eq!(wrapped.errno(), Some(95));
    assert!(wrapped.to_string().contains("RDMA_NLDEV_CMD_SET"), "{wrapped}");
}

#[test]
fn an_ack_completes_a_set() {
    let mut payload = 0i32.to_ne_bytes().to_vec();
    payload.extend(nlmsg(message_type(command::SET), 5, 6, &[]));
    let datagram = nlmsg(2, 0x100, 6, &payload);
    let message = split(&datagram).unwrap().remove(0);
    assert!(absorb(message, 6, NLM_F_ACK, &mut Vec::new()).unwrap());
}

#[test]
fn a_failed_dump_ends_with_its_errno() {
    let datagram = nlmsg(3, 2, 8, &(-19i32).to_ne_bytes());
    let message = split(&datagram).unwrap().remove(0);
    let err = absorb(message, 8, NLM_F_DUMP, &mut Vec::new()).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(19));
}

fn encode(command: u16, flags: u16, attributes: Vec<NldevAttribute>) -> Vec<u8> {
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | flags;
    header.sequence_number = 1;
    let mut message = NetlinkMessage::new(
        header,
        NetlinkPayload::InnerMessage(NldevMessage::new(command, attributes)),
    );
    message.finalize();
    let mut buffer = vec![0; message.buffer_len()];
    message.serialize(&mut buffer);
    buffer
}

#[test]
fn a_port_dump_request_encodes_as_rdma_link_sends_it() {
    let bytes = encode(command::PORT_GET, NLM_F_DUMP, vec![NldevAttribute::DevIndex(3)]);
    let expected = nlmsg(0x1405, 0x301, 1, &nla(attr::DEV_INDEX, &3u32.to_ne_bytes()));
    assert_eq!(bytes, expected);
}

#[test]
fn a_netns_move_request_encodes_index_and_descriptor() {
    let bytes = encode(
        command::SET,
        NLM_F_ACK,
        vec![NldevAttribute::DevIndex(3), NldevAttribute::NetNsFd(17)],
    );
    let payload =
        [nla(attr::DEV_INDEX, &3u32.to_ne_bytes()), nla(68, &17u32.to_ne_bytes())].concat();
    assert_eq!(bytes, nlmsg(0x1402, 0x5, 1, &payload));
}

#[test]
fn a_newlink_request_carries_nul_terminated_names() {
    let bytes = encode(
        command::NEWLINK,
        NLM_F_ACK,
        vec![
            NldevAttribute::DevName("rxe7".to_owned()),
            NldevAttribute::LinkType("rxe".to_owned()),
            NldevAttribute::NdevName("veth0".to_owned()),
        ],
    );
    let payload = [nla_str(2, "rxe7"), nla_str(65, "rxe"), nla_str(51, "veth0")].concat();
    assert_eq!(bytes, nlmsg(0x1403, 0x5, 1, &payload));
    // And it decodes back to the same attributes.
    let NetlinkPayload::InnerMessage(message) = split(&bytes).unwrap().remove(0).payload else {
        panic!("not inner")
    };
    assert_eq!(message.attributes[2], NldevAttribute::NdevName("veth0".to_owned()));
}

//! Who is on the other end of a loopback TCP connection: the owner of the client's socket,
//! as the kernel lists it in `/proc/net/tcp` and `/proc/net/tcp6` of this network namespace.
//!
//! This lets a local development server serve its own user only: a web page in a browser
//! (another user on a workstation, never root on a node) cannot borrow the server's
//! identity, and clients such as kubectl that send no credentials over plain HTTP still
//! work for that user. The table format is the kernel's (`tcp4_seq_show`,
//! `tcp6_seq_show`): addresses in hex, 32-bit words in host byte order, ports big-endian,
//! the owner's uid in the eighth column.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The uid owning the socket whose local address is `client` and whose peer is `server`.
#[must_use]
pub fn owner_uid(client: SocketAddr, server: SocketAddr) -> Option<u32> {
    let table = match client {
        SocketAddr::V4(_) => "/proc/net/tcp",
        SocketAddr::V6(_) => "/proc/net/tcp6",
    };
    let text = std::fs::read_to_string(table).ok()?;
    find_owner(&text, client, server)
}

/// [`owner_uid`] over the text of a table.
fn find_owner(table: &str, client: SocketAddr, server: SocketAddr) -> Option<u32> {
    table.lines().skip(1).find_map(|line| {
        let columns: Vec<&str> = line.split_whitespace().collect();
        let local = parse_endpoint(columns.get(1)?)?;
        let remote = parse_endpoint(columns.get(2)?)?;
        (local == client && remote == server).then(|| columns.get(7)?.parse().ok())?
    })
}

/// `0100007F:1F90` → 127.0.0.1:8080; 32 hex digits for IPv6.
fn parse_endpoint(text: &str) -> Option<SocketAddr> {
    let (address, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let words: Vec<u32> = (0..address.len() / 8)
        .map(|i| u32::from_str_radix(address.get(i * 8..i * 8 + 8)?, 16).ok())
        .collect::<Option<_>>()?;
    // Each 32-bit word was printed from host (little-endian) order.
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let ip = match bytes.len() {
        4 => IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3])),
        16 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(bytes.as_slice()).ok()?)),
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// This process's effective uid (from `/proc/self/status`).
#[must_use]
pub fn own_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find(|l| l.starts_with("Uid:"))?.split_whitespace().nth(2)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_owner_of_a_loopback_client_socket() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0\n\
   1: 0100007F:D431 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1000        0 2 1 0 20 4 30 10 -1\n\
   2: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0 20 4 30 10 -1\n";
        let server: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let client: SocketAddr = "127.0.0.1:54321".parse().unwrap();
        assert_eq!(find_owner(table, client, server), Some(1000));
        assert_eq!(find_owner(table, "127.0.0.1:1".parse().unwrap(), server), None);
        let v6 = "sl local remote\n 0: 00000000000000000000000001000000:D431 00000000000000000000000001000000:1F90 01 0:0 0:0 0 0 0 7 0\n";
        assert_eq!(
            find_owner(v6, "[::1]:54321".parse().unwrap(), "[::1]:8080".parse().unwrap()),
            Some(0)
        );
    }
}

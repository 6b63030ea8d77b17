//! Device and slice names: DNS labels that are stable across reboots (DESIGN §2).
//!
//! A name that had to be changed to become valid gets a short hash of the original, so two
//! interfaces that normalise to the same text (`eth_0`, `ETH.0`) still get distinct names.

use sha2::{Digest, Sha256};

use crate::model::device::PciAddress;

/// Longest DNS label (RFC 1123).
pub const MAX_LABEL_LEN: usize = 63;

/// Longest DNS subdomain (object names of most Kubernetes kinds).
pub const MAX_SUBDOMAIN_LEN: usize = 253;

/// Hex digits of the hash suffix: 24 bits, plenty to separate the handful of interfaces that
/// can collide on one node.
const HASH_LEN: usize = 6;

/// Name of a PCI-backed device: `pci-<dom>-<bus>-<dev>-<fn>`, e.g. `pci-0000-3b-00-1`.
#[must_use]
pub fn pci_device_name(address: &PciAddress) -> String {
    format!(
        "pci-{:04x}-{:02x}-{:02x}-{:x}",
        address.domain, address.bus, address.device, address.function
    )
}

/// Name of a device that is not PCI-backed: the interface name as a DNS label, with a hash
/// suffix when it had to change.
#[must_use]
pub fn interface_device_name(if_name: &str) -> String {
    if is_dns_label(if_name) {
        return if_name.to_owned();
    }
    let normalised: String = if_name
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '-' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '-',
        })
        .collect();
    with_hash_suffix(normalised.trim_matches('-'), if_name, MAX_LABEL_LEN)
}

/// `base` if it fits in `max_len`, else `base` cut short, in both cases followed by
/// `-<hash of key>` when `base` is not already the whole, valid answer.
///
/// Used where a name is derived from parts and may be too long (slot devices, slice names).
#[must_use]
pub fn fit_label(base: &str, max_len: usize) -> String {
    if base.len() <= max_len {
        return base.to_owned();
    }
    with_hash_suffix(base, base, max_len)
}

/// `base` (cut so the result fits in `max_len`) + `-` + a short hash of `key`.
#[must_use]
pub fn with_hash_suffix(base: &str, key: &str, max_len: usize) -> String {
    let digest = Sha256::digest(key.as_bytes());
    let hash: String = digest
        .iter()
        .flat_map(|byte| [byte >> 4, byte & 0xf])
        .take(HASH_LEN)
        .map(|nibble| char::from_digit(u32::from(nibble), 16).unwrap_or('0'))
        .collect();
    let keep = max_len.saturating_sub(HASH_LEN + 1);
    // The base is ASCII here (callers normalise first), so byte cuts are char cuts.
    let mut cut: String = base.chars().take(keep).collect();
    while cut.ends_with(['-', '.']) {
        cut.pop();
    }
    if cut.is_empty() { format!("if-{hash}") } else { format!("{cut}-{hash}") }
}

/// RFC 1123 label: 1–63 of `[a-z0-9-]`, starting and ending alphanumeric.
#[must_use]
pub fn is_dns_label(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= MAX_LABEL_LEN
        && text.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !text.starts_with('-')
        && !text.ends_with('-')
}

/// RFC 1123 subdomain: dot-separated labels, at most 253 characters.
#[must_use]
pub fn is_dns_subdomain(text: &str) -> bool {
    text.len() <= MAX_SUBDOMAIN_LEN && text.split('.').all(is_dns_label)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_names_follow_the_documented_pattern() {
        let address: PciAddress = "0000:3b:00.1".parse().unwrap();
        assert_eq!(pci_device_name(&address), "pci-0000-3b-00-1");
        // Domains above 0xffff exist (VMD); the name keeps every digit.
        let address = PciAddress { domain: 0x1_0000, bus: 0, device: 0x1f, function: 7 };
        assert_eq!(pci_device_name(&address), "pci-10000-00-1f-7");
    }

    #[test]
    fn valid_interface_names_are_kept() {
        for name in ["eth0", "enp59s0f1", "ens1f0v3", "bond0", "0eth"] {
            assert_eq!(interface_device_name(name), name);
        }
    }

    #[test]
    fn invalid_interface_names_become_labels_with_a_hash() {
        let name = interface_device_name("eth0.100");
        assert!(name.starts_with("eth0-100-"), "{name}");
        assert!(is_dns_label(&name), "{name}");
        assert_eq!(name.len(), "eth0-100-".len() + HASH_LEN);

        let upper = interface_device_name("ETH0");
        assert!(upper.starts_with("eth0-") && is_dns_label(&upper), "{upper}");
        assert_ne!(upper, "eth0", "a changed name always carries a hash");
    }

    #[test]
    fn names_that_normalise_alike_stay_distinct() {
        let a = interface_device_name("eth_0");
        let b = interface_device_name("eth.0");
        assert_ne!(a, b);
        assert!(is_dns_label(&a) && is_dns_label(&b));
    }

    #[test]
    fn names_are_stable() {
        assert_eq!(interface_device_name("Wi_Fi"), interface_device_name("Wi_Fi"));
        // Pinned value: a change here would rename devices on every upgraded node.
        assert_eq!(interface_device_name("eth_0"), "eth-0-247e4c");
    }

    #[test]
    fn names_of_only_punctuation_still_form_a_label() {
        let name = interface_device_name("__");
        assert!(name.starts_with("if-") && is_dns_label(&name), "{name}");
    }

    #[test]
    fn long_names_are_cut_to_a_label() {
        let base = format!("{}-s31", "a".repeat(70));
        let name = fit_label(&base, MAX_LABEL_LEN);
        assert_eq!(name.len(), MAX_LABEL_LEN);
        assert!(is_dns_label(&name), "{name}");
        assert_eq!(fit_label("short-s1", MAX_LABEL_LEN), "short-s1");
    }

    #[test]
    fn label_and_subdomain_rules() {
        assert!(is_dns_label("a-b"));
        assert!(!is_dns_label("-a"));
        assert!(!is_dns_label("a-"));
        assert!(!is_dns_label("A"));
        assert!(!is_dns_label(&"a".repeat(64)));
        assert!(is_dns_subdomain("node-1.example.com"));
        assert!(!is_dns_subdomain("node..x"));
    }
}

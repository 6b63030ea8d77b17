//! `IPBlock` object names (DESIGN §4): derived from the network and the canonical CIDR, so two
//! nodes racing for one block derive one name and the API server lets exactly one create it.
//!
//! `<podnetwork>.v4-<a>-<b>-<c>-<d>-<prefix>` and `<podnetwork>.v6-<groups>-<prefix>`: the
//! CIDR's `.`, `:` and `/` become `-` in a last DNS label of its own, tagged with its family.
//! The mapping is injective: the CIDR's label never holds a `.`, so the last `.` of a name
//! splits it back into the network (any DNS subdomain) and the label; within the label the
//! family tag says how to read it and the prefix is what follows the last `-`, while a
//! canonical address has one text. The names before this scheme,
//! `<podnetwork>-<cidr with . : / mapped to ->` ([`legacy_ip_block_name`]), were not:
//! `a` + `1:2::/64` and `a-1` + `2::/64` both gave `a-1-2---64`, so two networks' blocks
//! could collide on one name (one network then could not claim its block) and, worse, nothing
//! tied a name to one CIDR. Objects created under those names stay valid: a node acts on a
//! block by the name it has in the API and never derives it again.
//!
//! An `IPBlock` name is a DNS subdomain (custom resources are validated as such: at most 253
//! characters, labels of `[a-z0-9-]` starting and ending alphanumeric). The CIDR label is at
//! most `v6-` + 39 + `-128` = 46 characters; a network a claim can name is a DNS label of at
//! most 63 (`podNetwork` in a NetworkConfig), so a name is at most 110 characters, and no
//! hash is needed: the name stays checkable by an admission policy in CEL (which has no
//! hash function), e.g.
//! `spec.podNetwork + '.v' + (spec.cidr.contains(':') ? '6' : '4') + '-' +
//!  spec.cidr.replace('.', '-').replace(':', '-').replace('/', '-')`
//! for a CIDR in canonical form. Only a network name longer than 206 characters (which no
//! claim can name, so no node creates blocks of it) falls back to
//! `<network cut>.h-<16 hex of sha256(network/cidr)>`, a label no CIDR label can equal.

/// Longest object name of a custom resource (a DNS-1123 subdomain).
pub const MAX_OBJECT_NAME: usize = 253;

/// The `IPBlock` name of `cidr` (canonical text, as `IpNetwork`'s `Display` writes it) in
/// `pod_network`: `<podnetwork>.v4-10-10-0-64-26`, `<podnetwork>.v6-fd00-10---120`.
#[must_use]
pub fn ip_block_name(pod_network: &str, cidr: &str) -> String {
    let family = if cidr.contains(':') { '6' } else { '4' };
    let mapped: String = cidr
        .chars()
        .map(|c| if matches!(c, '.' | ':' | '/') { '-' } else { c.to_ascii_lowercase() })
        .collect();
    let name = format!("{pod_network}.v{family}-{mapped}");
    if name.len() <= MAX_OBJECT_NAME {
        return name;
    }
    let hex = super::short_hash(&format!("{pod_network}/{cidr}"));
    // 253 - 1 (dot) - 2 ("h-") - 16 (hash); the cut network must still end alphanumeric.
    let prefix: String = pod_network.chars().take(MAX_OBJECT_NAME - 19).collect();
    format!("{}.h-{hex}", prefix.trim_end_matches(['-', '.']))
}

/// The name an `IPBlock` got before [`ip_block_name`] (`<podnetwork>-<cidr with . : / mapped
/// to ->`, hashed past 63 characters). Never used to create a block: it names the objects an
/// older release created, for tests and tools that build such objects.
#[must_use]
pub fn legacy_ip_block_name(pod_network: &str, cidr: &str) -> String {
    const LEGACY_MAX: usize = 63;
    let mapped: String =
        cidr.chars().map(|c| if matches!(c, '.' | ':' | '/') { '-' } else { c }).collect();
    let name = format!("{pod_network}-{}", mapped.to_ascii_lowercase());
    if name.len() <= LEGACY_MAX {
        return name;
    }
    let hex = super::short_hash(&format!("{pod_network}/{cidr}"));
    let prefix: String = pod_network.chars().take(LEGACY_MAX - 17).collect();
    format!("{}-{hex}", prefix.trim_end_matches('-'))
}

/// Whether `name` is a DNS-1123 subdomain, as the API server checks custom resource names.
#[must_use]
pub fn is_dns_subdomain(name: &str) -> bool {
    let label_ok = |label: &str| {
        !label.is_empty()
            && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    !name.is_empty() && name.len() <= MAX_OBJECT_NAME && name.split('.').all(label_ok)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn names_carry_the_family_and_the_mapped_cidr_in_a_label_of_their_own() {
        assert_eq!(ip_block_name("medianet", "10.10.0.64/26"), "medianet.v4-10-10-0-64-26");
        assert_eq!(ip_block_name("medianet", "fd00:10::/120"), "medianet.v6-fd00-10---120");
        assert_eq!(ip_block_name("medianet", "10.10.1.5/32"), "medianet.v4-10-10-1-5-32");
        // A CIDR starting with "::" still gives a label that starts alphanumeric.
        let name = ip_block_name("medianet", "::ffff:10.0.0.0/120");
        assert_eq!(name, "medianet.v6---ffff-10-0-0-0-120");
        assert!(is_dns_subdomain(&name), "{name}");
    }

    #[test]
    fn the_old_scheme_collided_across_networks_and_the_new_one_does_not() {
        // The finding: two networks, two CIDRs, one old name.
        assert_eq!(
            legacy_ip_block_name("a", "1:2::/64"),
            legacy_ip_block_name("a-1", "2::/64"),
            "the legacy scheme is the one that collided"
        );
        assert_ne!(ip_block_name("a", "1:2::/64"), ip_block_name("a-1", "2::/64"));
    }

    #[test]
    fn no_two_networks_and_cidrs_share_a_name() {
        // Networks built to collide on the old separator, over both families, many CIDRs
        // each: every (network, CIDR) has its own name, and each is a DNS subdomain.
        let networks = ["a", "a-1", "a-1-2", "a.1", "a-v4", "a.v4", "a-10", "n", "n-fd00"];
        let mut cidrs: Vec<String> = Vec::new();
        for prefix in [24u8, 26, 32] {
            for third in [0u8, 1, 2, 10] {
                let net: ipnetwork::IpNetwork = format!("10.{third}.2.0/{prefix}").parse().unwrap();
                cidrs.push(ipnetwork::IpNetwork::new(net.network(), prefix).unwrap().to_string());
            }
        }
        for text in ["1:2::/64", "2::/64", "1::2:0/112", "fd00:10::/120", "fd00::10:0/120"] {
            let net: ipnetwork::IpNetwork = text.parse().unwrap();
            cidrs.push(ipnetwork::IpNetwork::new(net.network(), net.prefix()).unwrap().to_string());
        }
        let mut seen: BTreeMap<String, (String, String)> = BTreeMap::new();
        for network in networks {
            for cidr in &cidrs {
                let name = ip_block_name(network, cidr);
                assert!(is_dns_subdomain(&name), "{name}");
                if let Some(first) = seen.insert(name.clone(), (network.into(), cidr.clone())) {
                    panic!("{name}: {first:?} and ({network}, {cidr})");
                }
            }
        }
    }

    #[test]
    fn the_longest_usable_network_fits_and_longer_ones_hash() {
        let label = "n".repeat(63);
        let name = ip_block_name(&label, "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ff00/120");
        assert_eq!(name.len(), 63 + 1 + 46, "{name}");
        assert!(is_dns_subdomain(&name), "{name}");
        let long =
            format!("{}.{}.{}.{}", "a".repeat(60), "b".repeat(60), "c".repeat(60), "d".repeat(60));
        let hashed = ip_block_name(&long, "10.0.0.0/26");
        assert!(is_dns_subdomain(&hashed), "{hashed}");
        assert_ne!(hashed, ip_block_name(&long, "10.0.0.64/26"));
        assert!(!is_dns_subdomain("a.-b") && !is_dns_subdomain("A") && is_dns_subdomain("a.b-c"));
    }
}

//! docs/network-config.md is the reference for what a user writes and reads: every field of
//! the `NetworkConfig` (the opaque claim/DeviceClass parameters), every property of the
//! `PodNetwork` and `IPBlock` CRDs, and every flag of `netclaim node` and `netclaim
//! controller`. The lists are taken from the code, never written out here: a fully populated
//! `NetworkConfig` serialised (its struct literals spell every field, so a new field does not
//! compile until it is added here, and then fails until it is documented), the
//! `openAPIV3Schema` of deploy/crds/, and clap's definition of the command line. Each must
//! have a table row of its own (`| \`path\``) in the document's section for its kind, carrying
//! the defaults, bounds and values the code states.
//!
//! The docs and README cite repository files, never sections of a design document that is
//! not in the repository.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use std::path::PathBuf;

use clap::CommandFactory;
use netclaim::cli::Cli;
use netclaim::model::bandwidth::{BandwidthConfig, IngressPolicy};
use netclaim::model::network_config::RdmaConfig;
use netclaim::model::network_config::{
    self, InterfaceConfig, IpamConfig, IpvlanConfig, IpvlanFlag, IpvlanMode, MacvlanConfig,
    MacvlanMode, Mode, NetworkConfig, PoolConfig, RouteConfig, SriovConfig, VfLinkState,
    VfVlanProtocol,
};
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn doc() -> String {
    std::fs::read_to_string(root().join("docs/network-config.md")).unwrap()
}

/// The text of the section whose heading line starts with `heading`, up to the next heading
/// of the same or a higher level.
fn section<'d>(doc: &'d str, heading: &str) -> &'d str {
    let level = heading.chars().take_while(|c| *c == '#').count();
    let start = doc
        .lines()
        .position(|line| line.starts_with(heading))
        .unwrap_or_else(|| panic!("docs/network-config.md has no section {heading:?}"));
    let lines: Vec<&str> = doc.lines().collect();
    let end = lines[start + 1..]
        .iter()
        .position(|line| {
            let hashes = line.chars().take_while(|c| *c == '#').count();
            hashes > 0 && hashes <= level && line[hashes..].starts_with(' ')
        })
        .map_or(lines.len(), |offset| start + 1 + offset);
    let first = lines[..start].iter().map(|l| l.len() + 1).sum::<usize>();
    let last = lines[..end].iter().map(|l| l.len() + 1).sum::<usize>().min(doc.len());
    &doc[first..last]
}

/// The table row of `key` (a line starting `| \`key\``), if the section has one.
fn row<'s>(section: &'s str, key: &str) -> Option<&'s str> {
    let start = format!("| `{key}`");
    section
        .lines()
        .find(|line| line.starts_with(&start) && line[start.len()..].trim_start().starts_with('|'))
}

/// Every path of a JSON value: `a.b` for objects, `a[]` then `a[].c` for arrays of objects.
fn paths(value: &Value, prefix: &str, out: &mut Vec<String>) {
    match value {
        Value::Object(fields) => {
            for (name, field) in fields {
                let path =
                    if prefix.is_empty() { name.clone() } else { format!("{prefix}.{name}") };
                out.push(path.clone());
                paths(field, &path, out);
            }
        }
        Value::Array(items) => {
            for item in items.iter().filter(|item| item.is_object()) {
                paths(item, &format!("{prefix}[]"), out);
            }
        }
        _ => {}
    }
}

/// Every variant of an enum, in a list that a new variant makes fail to compile (the match
/// is exhaustive over the same names).
macro_rules! variants {
    ($ty:ident: $($variant:ident),+ $(,)?) => {{
        #[allow(dead_code, reason = "the match only has to compile")]
        fn exhaustive(value: $ty) {
            match value {
                $($ty::$variant)|+ => {}
            }
        }
        vec![$($ty::$variant),+]
    }};
}

/// The wire spelling of every variant (serde's, as a config is written).
fn wire<T: serde::Serialize>(values: &[T]) -> Vec<String> {
    values.iter().map(|v| serde_json::to_value(v).unwrap().as_str().unwrap().to_owned()).collect()
}

/// A `NetworkConfig` with every field set, down to every nested field. No `..Default` here:
/// a field added to any of these types must be spelled out, and is then checked below.
fn every_field() -> NetworkConfig {
    NetworkConfig {
        api_version: Some(network_config::API_VERSION.to_owned()),
        kind: Some(network_config::KIND.to_owned()),
        pod_network: Some("medianet".to_owned()),
        mode: Some(Mode::SriovVf),
        interface: Some(InterfaceConfig {
            name: Some("net1".to_owned()),
            mtu: Some(1500),
            hardware_address: Some("02:00:00:00:00:01".to_owned()),
        }),
        macvlan: Some(MacvlanConfig { mode: Some(MacvlanMode::Bridge) }),
        ipvlan: Some(IpvlanConfig { mode: Some(IpvlanMode::L2), flag: Some(IpvlanFlag::Bridge) }),
        vlan: Some(100),
        ipam: Some(IpamConfig {
            addresses: Some(vec!["10.10.1.5/24".to_owned()]),
            pool: Some(PoolConfig {
                subnet: Some("10.10.1.0/24".to_owned()),
                range_start: Some("10.10.1.10".to_owned()),
                range_end: Some("10.10.1.200".to_owned()),
                gateway: Some("10.10.1.1".to_owned()),
                exclude: Some(vec!["10.10.1.100/30".to_owned()]),
            }),
        }),
        routes: Some(vec![RouteConfig {
            destination: "0.0.0.0/0".to_owned(),
            gateway: Some("10.10.1.1".to_owned()),
            metric: Some(200),
        }]),
        sriov: Some(SriovConfig {
            qos: Some(0),
            spoof_check: Some(true),
            trust: Some(false),
            max_tx_rate_mbps: Some(0),
            min_tx_rate_mbps: Some(0),
            link_state: Some(VfLinkState::Auto),
            vlan_protocol: Some(VfVlanProtocol::Ieee8021Q),
        }),
        stats: Some(true),
        routing: Some(network_config::RoutingConfig { table: Some(0), source_rules: Some(true) }),
        vrf: Some(network_config::VrfConfig { name: Some("vrf-red".to_owned()), table: Some(100) }),
        // A map has no fixed fields: its row documents the keys.
        sysctls: Some(std::collections::BTreeMap::new()),
        bandwidth: Some(BandwidthConfig {
            limit: Some("500M".into()),
            ingress: Some(IngressPolicy::Police),
        }),
        rdma: Some(RdmaConfig::Exclusive),
        // `features` is a map: its row documents the keys.
        ethtool: Some(network_config::EthtoolConfig {
            features: Some(std::collections::BTreeMap::new()),
            rings: Some(network_config::EthtoolRings {
                rx: Some(1024),
                tx: Some(1024),
                rx_mini: Some(0),
                rx_jumbo: Some(0),
            }),
            channels: Some(network_config::EthtoolChannels {
                rx: Some(0),
                tx: Some(0),
                other: Some(0),
                combined: Some(4),
            }),
        }),
    }
}

#[test]
fn every_network_config_field_has_a_row() {
    let value = serde_json::to_value(every_field()).unwrap();
    // The serialised names are the names the strict decoder accepts.
    network_config::decode(0, &value).unwrap();
    let mut fields = Vec::new();
    paths(&value, "", &mut fields);
    assert!(fields.len() > 30, "the walk found too few fields: {fields:?}");
    let doc = doc();
    let section = section(&doc, "## NetworkConfig");
    let missing: Vec<&String> = fields.iter().filter(|f| row(section, f).is_none()).collect();
    assert!(
        missing.is_empty(),
        "docs/network-config.md, section NetworkConfig, has no row `| \\`<field>\\` |` for {missing:?}"
    );
    // The limits the code enforces, in their field's row.
    for (field, limit) in
        [("ipam.addresses", network_config::MAX_ADDRESSES), ("routes", network_config::MAX_ROUTES)]
    {
        let line = row(section, field).unwrap();
        assert!(
            line.contains(&limit.to_string()),
            "the row of {field} should state {limit}: {line}"
        );
    }
    assert!(
        section.contains(&network_config::MAX_PARAMETERS_BYTES.to_string()),
        "the NetworkConfig section should state the {} bytes limit of parameters",
        network_config::MAX_PARAMETERS_BYTES
    );
}

#[test]
fn every_network_config_value_is_in_its_row() {
    let doc = doc();
    let section = section(&doc, "## NetworkConfig");
    let enums: [(&str, Vec<String>); 7] = [
        ("mode", wire(&variants!(Mode: Macvlan, Ipvlan, HostDevice, SriovVf, Vfio))),
        ("macvlan.mode", wire(&variants!(MacvlanMode: Bridge, Private, Vepa, Passthru))),
        ("ipvlan.mode", wire(&variants!(IpvlanMode: L2, L3, L3s))),
        ("ipvlan.flag", wire(&variants!(IpvlanFlag: Bridge, Private, Vepa))),
        ("sriov.linkState", wire(&variants!(VfLinkState: Auto, Enable, Disable))),
        ("sriov.vlanProtocol", wire(&variants!(VfVlanProtocol: Ieee8021Q, Ieee8021Ad))),
        ("rdma", wire(&variants!(RdmaConfig: Exclusive, Shared, Disabled))),
    ];
    for (field, values) in enums {
        let line = row(section, field).unwrap_or_else(|| panic!("no row for {field}"));
        for value in values {
            assert!(
                line.contains(&format!("`{value}`")),
                "the row of {field} lacks `{value}`: {line}"
            );
        }
    }
}

/// Paths whose schema is a standard Kubernetes type, documented as that type rather than
/// field by field.
const STANDARD_TYPES: [&str; 3] = ["conditions", "nodeSelector", "namespaceSelector"];

/// Every property path of an `openAPIV3Schema` below `prefix`, with its schema.
fn schema_paths<'v>(schema: &'v Value, prefix: &str, out: &mut Vec<(String, &'v Value)>) {
    let Some(properties) = schema["properties"].as_object() else { return };
    for (name, property) in properties {
        let path = if prefix.is_empty() { name.clone() } else { format!("{prefix}.{name}") };
        out.push((path.clone(), property));
        if STANDARD_TYPES.contains(&name.as_str()) {
            continue;
        }
        schema_paths(property, &path, out);
        if property["items"].is_object() {
            schema_paths(&property["items"], &format!("{path}[]"), out);
        }
    }
}

/// What a row must say about a property: its default, bounds and allowed values.
fn stated(property: &Value) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(default) = property.get("default").filter(|d| !d.is_object()) {
        out.push(default.as_str().map_or_else(|| default.to_string(), str::to_owned));
    }
    for bound in ["minimum", "maximum", "maxItems"] {
        if let Some(n) = property.get(bound).and_then(Value::as_u64) {
            out.push(n.to_string());
        }
    }
    for value in property["enum"].as_array().into_iter().flatten() {
        out.push(format!("`{}`", value.as_str().unwrap()));
    }
    out
}

#[test]
fn every_crd_property_has_a_row_with_its_default_and_bounds() {
    let doc = doc();
    for (file, kind) in [("podnetworks.yaml", "PodNetwork"), ("ipblocks.yaml", "IPBlock")] {
        let text = std::fs::read_to_string(root().join("deploy/crds").join(file)).unwrap();
        let crd: Value = yaml_serde::from_str(&text).unwrap();
        let section = section(&doc, &format!("## {kind}"));
        for version in crd["spec"]["versions"].as_array().unwrap() {
            let schema = &version["schema"]["openAPIV3Schema"];
            let mut properties = Vec::new();
            for top in ["spec", "status"] {
                properties.push((top.to_owned(), &schema["properties"][top]));
                schema_paths(&schema["properties"][top], top, &mut properties);
            }
            assert!(properties.len() > 5, "{file}: the walk found too few properties");
            let mut missing = Vec::new();
            for (path, property) in properties {
                let Some(line) = row(section, &path) else {
                    missing.push(path);
                    continue;
                };
                for fact in stated(property) {
                    assert!(line.contains(&fact), "{kind} row {path} should state {fact}: {line}");
                }
            }
            assert!(
                missing.is_empty(),
                "docs/network-config.md, section {kind}, has no row `| \\`<path>\\` |` for {missing:?}"
            );
        }
    }
}

#[test]
fn every_node_and_controller_flag_has_a_row() {
    let mut cli = Cli::command();
    cli.build();
    let doc = doc();
    for name in ["node", "controller"] {
        let command = cli.find_subcommand(name).unwrap();
        let section = section(&doc, &format!("### `netclaim {name}`"));
        let mut checked = 0;
        for arg in command.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if matches!(long, "help" | "version") {
                continue;
            }
            checked += 1;
            let flag = format!("--{long}");
            let line = row(section, &flag)
                .unwrap_or_else(|| panic!("netclaim {name}: no row `| \\`{flag}\\` |`"));
            if let Some(env) = arg.get_env() {
                let env = env.to_string_lossy();
                assert!(line.contains(&format!("`{env}`")), "{flag} row lacks `{env}`: {line}");
            }
            for default in arg.get_default_values() {
                let default = default.to_string_lossy();
                assert!(
                    line.contains(&format!("`{default}`")),
                    "{flag} row lacks `{default}`: {line}"
                );
            }
            // The values of an enum flag (`--sharing-mode`); a boolean's `true`/`false` are
            // not listed, its default is.
            let values = arg.get_possible_values();
            for value in values.iter().filter(|v| !v.is_hide_set()) {
                let value = value.get_name();
                if value != "true" && value != "false" {
                    assert!(line.contains(&format!("`{value}`")), "{flag} row lacks `{value}`");
                }
            }
        }
        assert!(checked > 3, "netclaim {name}: too few flags found");
    }
}

#[test]
fn docs_cite_repository_files_not_design_sections() {
    let mut files = vec![root().join("README.md")];
    for entry in std::fs::read_dir(root().join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            files.push(path);
        }
    }
    for file in files {
        // Whitespace folded, so a citation wrapped over two lines is found too.
        let text = std::fs::read_to_string(&file).unwrap();
        let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
        if let Some(at) = flat.find("DESIGN §") {
            let context: String = flat[at..].chars().take(60).collect();
            panic!(
                "{} cites a DESIGN section, which is not in the repository: {context}",
                file.display()
            );
        }
    }
}

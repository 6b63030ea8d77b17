//! The core does no I/O and owns its ports (DESIGN §9): `model`, `inventory`, `claims`, `ipam`,
//! `podnet::plan` and `health` must not reach an adapter of this crate (`host`, `k8s`, `kubelet`,
//! `node`, `store`, `cdi`, `attach`, `dev`, `controller`, `cli`, `metrics`) nor a crate that talks
//! to the kernel, the cluster or a scraper (kube, tonic, ttrpc, rtnetlink, netlink-*, nix, aya,
//! prometheus_client, axum), nor `std::fs`.
//!
//! The check parses each core file with `syn`, following `mod` declarations from the core
//! roots, and walks every `use` tree and every path in the code. Code under `#[cfg(test)]` is
//! left out: a core unit test may drive a real adapter (the claim tests use the real store).
//! Paths inside macro invocations are token streams, not paths, and are not seen.

use std::path::{Path, PathBuf};

use syn::visit_mut::VisitMut;

/// Modules of the crate the core must not import.
const ADAPTER_MODULES: &[&str] = &[
    "host",
    "k8s",
    "kubelet",
    "node",
    "store",
    "cdi",
    "attach",
    "dev",
    "controller",
    "cli",
    "metrics",
];
/// Crates the core must not import (netlink-* as a prefix).
const IO_CRATES: &[&str] =
    &["kube", "tonic", "ttrpc", "rtnetlink", "nix", "aya", "prometheus_client", "axum"];

/// The roots of the core: a `mod.rs` (the module's children live beside it) or a file.
const CORE_ROOTS: &[&str] = &[
    "src/model/mod.rs",
    "src/inventory/mod.rs",
    "src/claims/mod.rs",
    "src/ipam/mod.rs",
    "src/podnet/plan.rs",
    "src/health/mod.rs",
];

/// One forbidden import: where and what.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Violation {
    file: String,
    path: String,
}

/// Why a path is forbidden in the core, or `None`.
fn forbidden(segments: &[String]) -> Option<&'static str> {
    let first = segments.first()?.as_str();
    let second = segments.get(1).map(String::as_str);
    match (first, second) {
        ("crate", Some(module)) if ADAPTER_MODULES.contains(&module) => Some("adapter module"),
        ("std", Some("fs")) => Some("file system"),
        (name, _) if IO_CRATES.contains(&name) || name.starts_with("netlink_") => Some("I/O crate"),
        _ => None,
    }
}

/// Every full path a `use` tree names (`use a::{b, c::d}` → `a::b`, `a::c::d`).
fn use_paths(prefix: &mut Vec<String>, tree: &syn::UseTree, out: &mut Vec<Vec<String>>) {
    match tree {
        syn::UseTree::Path(path) => {
            prefix.push(path.ident.to_string());
            use_paths(prefix, &path.tree, out);
            prefix.pop();
        }
        syn::UseTree::Name(name) => {
            let mut full = prefix.clone();
            full.push(name.ident.to_string());
            out.push(full);
        }
        syn::UseTree::Rename(rename) => {
            let mut full = prefix.clone();
            full.push(rename.ident.to_string());
            out.push(full);
        }
        syn::UseTree::Glob(_) => out.push(prefix.clone()),
        syn::UseTree::Group(group) => {
            for item in &group.items {
                use_paths(prefix, item, out);
            }
        }
    }
}

fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        attr.path().is_ident("cfg")
            && attr.parse_args::<syn::Meta>().is_ok_and(|meta| meta.path().is_ident("test"))
    })
}

/// Collects forbidden paths of one file and the `mod` declarations it makes (not test ones).
#[derive(Default)]
struct Scan {
    found: Vec<Vec<String>>,
    child_modules: Vec<(String, Option<String>)>,
}

impl VisitMut for Scan {
    fn visit_item_mut(&mut self, item: &mut syn::Item) {
        let attrs = match item {
            syn::Item::Mod(m) => &m.attrs,
            syn::Item::Fn(f) => &f.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Use(u) => &u.attrs,
            syn::Item::Struct(s) => &s.attrs,
            syn::Item::Enum(e) => &e.attrs,
            syn::Item::Const(c) => &c.attrs,
            syn::Item::Static(s) => &s.attrs,
            syn::Item::Trait(t) => &t.attrs,
            syn::Item::Type(t) => &t.attrs,
            _ => &Vec::new(),
        };
        if is_cfg_test(attrs) {
            return;
        }
        if let syn::Item::Mod(module) = item
            && module.content.is_none()
        {
            let path_attr = module.attrs.iter().find(|a| a.path().is_ident("path")).and_then(|a| {
                match &a.meta {
                    syn::Meta::NameValue(nv) => match &nv.value {
                        syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. }) => {
                            Some(s.value())
                        }
                        _ => None,
                    },
                    _ => None,
                }
            });
            self.child_modules.push((module.ident.to_string(), path_attr));
        }
        if let syn::Item::ExternCrate(krate) = item {
            self.found.push(vec![krate.ident.to_string()]);
        }
        syn::visit_mut::visit_item_mut(self, item);
    }

    fn visit_item_use_mut(&mut self, item: &mut syn::ItemUse) {
        let mut out = Vec::new();
        use_paths(&mut Vec::new(), &item.tree, &mut out);
        self.found.extend(out);
    }

    fn visit_path_mut(&mut self, path: &mut syn::Path) {
        self.found.push(path.segments.iter().map(|s| s.ident.to_string()).collect());
        syn::visit_mut::visit_path_mut(self, path);
    }
}

/// Violations in `source` (a file's text) and its non-test child module declarations.
fn scan_source(file: &str, source: &str) -> (Vec<Violation>, Vec<(String, Option<String>)>) {
    let mut syntax = syn::parse_file(source).unwrap_or_else(|e| panic!("parsing {file}: {e}"));
    let mut scan = Scan::default();
    scan.visit_file_mut(&mut syntax);
    let violations = scan
        .found
        .iter()
        .filter(|segments| forbidden(segments).is_some())
        .map(|segments| Violation { file: file.to_owned(), path: segments.join("::") })
        .collect();
    (violations, scan.child_modules)
}

/// The file of child module `name` declared in `file` (Rust 2018 module paths).
fn child_file(file: &Path, name: &str, path_attr: Option<&str>) -> PathBuf {
    let dir = file.parent().expect("a source file has a directory");
    let stem = file.file_stem().and_then(|s| s.to_str()).expect("a UTF-8 file name");
    let base = if stem == "mod" || stem == "lib" { dir.to_owned() } else { dir.join(stem) };
    if let Some(explicit) = path_attr {
        return dir.join(explicit);
    }
    let flat = base.join(format!("{name}.rs"));
    if flat.exists() { flat } else { base.join(name).join("mod.rs") }
}

fn scan_tree(root: &Path, crate_dir: &Path, violations: &mut Vec<Violation>, files: &mut usize) {
    let source = std::fs::read_to_string(root)
        .unwrap_or_else(|e| panic!("reading core file {}: {e}", root.display()));
    let shown = root.strip_prefix(crate_dir).unwrap_or(root).display().to_string();
    let (found, children) = scan_source(&shown, &source);
    *files += 1;
    violations.extend(found);
    for (name, path_attr) in children {
        scan_tree(&child_file(root, &name, path_attr.as_deref()), crate_dir, violations, files);
    }
}

#[test]
fn the_core_imports_no_adapter_and_no_io_crate() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut violations = Vec::new();
    let mut files = 0;
    for root in CORE_ROOTS {
        scan_tree(&crate_dir.join(root), crate_dir, &mut violations, &mut files);
    }
    // The roots and their children: a walk that found nothing would prove nothing.
    assert!(files >= 15, "only {files} core files were found");
    assert!(
        violations.is_empty(),
        "the core reaches adapters or I/O (DESIGN §9):\n{}",
        violations
            .iter()
            .map(|v| format!("  {}: {}", v.file, v.path))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn the_check_finds_every_kind_of_forbidden_path() {
    let source = r#"
        use std::{collections::HashMap, fs};
        use crate::store::Store;
        use crate::model::{ClaimRef, device::Device};
        use netlink_packet_route::link::LinkMessage;
        use kube as k;
        extern crate nix;
        fn f() -> std::io::Result<String> {
            let _ = crate::host::discovery::discover();
            let _handle: rtnetlink::Handle = todo();
            std::fs::read_to_string("x")
        }
        #[cfg(test)]
        mod tests {
            use crate::store::Store;
        }
        #[cfg(test)]
        mod file_tests;
        mod child;
    "#;
    let (violations, children) = scan_source("sample.rs", source);
    let paths: Vec<&str> = violations.iter().map(|v| v.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "std::fs",
            "crate::store::Store",
            "netlink_packet_route::link::LinkMessage",
            "kube",
            "nix",
            "crate::host::discovery::discover",
            "rtnetlink::Handle",
            "std::fs::read_to_string",
        ]
    );
    assert_eq!(children, [("child".to_owned(), None)]);
}
